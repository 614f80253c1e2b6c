#!/bin/bash
# Benchmark 3 on the lent H200 (benchmarks/gpu/auto_shards.py says what is measured): a real head, Ray and one agent
# lending `cuda`; 400,000 seeded 3x64x64 images in one .npy; the GPU's raw rate for the ResNet-18-shaped model in a
# process of its own; then the job with `shards: auto` while NVML's counter is read every 50 ms; prints the table.
# Before it, `run` calls staged in /tmp/parts ray.part.aa, ray.part.ab and the small cp312 wheels as for
# farm_on_h200.sh (docs/h200-run.md), plus the data plane's: fsspec (pure Python) and pyarrow (cp312 manylinux, carried
# in two parts and put together as /tmp/parts/pyarrow-*.whl by the staging call); it runs from a clean `git archive`
# of the commit under test, unpacked and run from its root.
REAL_OUT=${OUT:-/tmp/out-final}; export OUT=/tmp/o; mkdir -p $OUT
export PYTHONUNBUFFERED=1 COLUMNS=200
cat /tmp/parts/ray.part.aa /tmp/parts/ray.part.ab > /tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  /tmp/parts/*.whl /tmp/ray-*.whl 2>&1 | tail -3
export PYTHONPATH=/tmp/site:$PWD:$PWD/agents
mkdir -p /tmp/bin && printf '#!/bin/bash\nexec python3 -m ray.scripts.scripts "$@"\n' > /tmp/bin/ray && chmod +x /tmp/bin/ray
export PATH=/tmp/bin:$PATH FARM_STATE_DIR=/tmp/farm-state
python3 -c "import ray, pyarrow, farm.head.server, farm.data, farm_agent.daemon.main, pynvml, torch; print('imports ok', ray.__version__, pyarrow.__version__, torch.__version__)" || exit 3
B=benchmarks/gpu/auto_shards.py
python3 $B data /tmp/bench-data --rows ${ROWS:-400000} | tail -1
python3 $B raw /tmp/bench-data --batch-size ${BATCH:-512} | tee $OUT/raw.json
F="python3 -m farm.cli.main"
$F head start --host 127.0.0.1 --port 7710 --ray-user root --detach 2>&1 | tail -2
JOIN=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['join_token'])")
CA=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['ca_hash'])")
FARM_JOIN_TOKEN=$JOIN $F agent start --head 127.0.0.1:7710 --ca-hash "$CA" --name h200-gpu --backends cuda --cpus 8 \
  --max-foreign-cpu 100 --ray-user root --detach 2>&1 | tail -1
$F nodes --json > $OUT/nodes.json; grep -h "idle" /tmp/farm-state/agents/*/agent.log | tail -2
timeout ${JOB_TIMEOUT_S:-300} python3 $B job /tmp/bench-data --raw $OUT/raw.json --batch-size ${BATCH:-512} 2>&1 | tee $OUT/table.md
JOB=$(grep -o "^job j-[0-9a-f]*" $OUT/table.md | cut -d' ' -f2)
[ -n "$JOB" ] && $F job $JOB --explain > $OUT/explain.txt 2>&1 && head -40 $OUT/explain.txt
[ -n "$JOB" ] && $F job $JOB --json > $OUT/job.json
$F agent stop 2>&1 | tail -1; $F head stop 2>&1 | tail -1
cp /tmp/farm-state/head.log $OUT/ 2>/dev/null; cp /tmp/farm-state/agents/*/agent.log $OUT/ 2>/dev/null
mkdir -p $REAL_OUT; cp $OUT/* $REAL_OUT/ 2>/dev/null
