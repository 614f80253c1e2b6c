#!/bin/bash
# Issue 27's benchmark on the lent H200 (benchmarks/gpu/workers.py says what is measured): a real head and one agent
# lending `cuda` (a lent node: no Ray on it; its shards come over its work stream into one persistent worker); a
# compute-bound job of 20 shards; the gap between shards on the GPU, the GPU's busy share, against a plain loop.
# Before it, two `run` calls staged the cp312 wheels Farm needs and the image lacks (ray, pyarrow, pydantic, ...) as
# one tar in three parts under 64 MiB (.whl/gpu/c1..c3, made by `split -b 52m` of the tar): this call carries the
# third and puts them together.
export OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export PYTHONUNBUFFERED=1 COLUMNS=200
cp .whl/gpu/c3/* /tmp/parts/ 2>/dev/null
cat /tmp/parts/wheels.part.aa /tmp/parts/wheels.part.ab /tmp/parts/wheels.part.ac > /tmp/wheels.tar
md5sum /tmp/wheels.tar
mkdir -p /tmp/whl && tar xf /tmp/wheels.tar -C /tmp/whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  /tmp/whl/*.whl 2>&1 | tail -3
export PYTHONPATH=/tmp/site:$PWD:$PWD/agents
mkdir -p /tmp/bin && printf '#!/bin/bash\nexec python3 -m ray.scripts.scripts "$@"\n' > /tmp/bin/ray && chmod +x /tmp/bin/ray
export PATH=/tmp/bin:$PATH FARM_STATE_DIR=/tmp/farm-state
python3 -c "import ray, pyarrow, farm.head.server, farm.data, farm_agent.daemon.main, farm_agent.work.host, pynvml, torch; print('imports ok', ray.__version__, pyarrow.__version__, torch.__version__)" || exit 3
F="python3 -m farm.cli.main"
$F head start --host 127.0.0.1 --port 7710 --ray-user root --detach 2>&1 | tail -1
CA=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['ca_hash'])")
FARM_JOIN_TOKEN=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['join_token'])") \
  $F agent start --head 127.0.0.1:7710 --ca-hash "$CA" --name h200-gpu --backends cuda --cpus 8 \
  --max-foreign-cpu 100 --ray-user root --detach 2>&1 | tail -1
$F nodes --json > $OUT/nodes.json
mkdir -p /tmp/bench && chmod 777 /tmp/bench
for run in ${RUNS:-1 2}; do
  timeout ${JOB_TIMEOUT_S:-240} python3 benchmarks/gpu/workers.py /tmp/bench/run$run ${ARGS:-} 2>&1 | tee $OUT/table$run.txt
  cp /tmp/bench/run$run/workers.json $OUT/workers$run.json 2>/dev/null
done
JOB=$(python3 -c "import json;print(json.load(open('$OUT/workers1.json'))['job']['id'])" 2>/dev/null)
[ -n "$JOB" ] && $F job $JOB --explain > $OUT/explain.txt 2>&1 && head -30 $OUT/explain.txt
[ -n "$JOB" ] && $F logs $JOB > $OUT/logs.txt 2>&1 && grep -c "worker started" $OUT/logs.txt
$F agent stop 2>&1 | tail -1; $F head stop 2>&1 | tail -1
cp /tmp/farm-state/head.log $OUT/ 2>/dev/null; cp /tmp/farm-state/agents/*/agent.log $OUT/ 2>/dev/null
cp /tmp/farm-state/agents/*/workers/*.log $OUT/ 2>/dev/null
