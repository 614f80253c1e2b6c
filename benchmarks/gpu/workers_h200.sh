#!/bin/bash
# Issue 27's benchmark on the lent H200 (benchmarks/gpu/workers.py says what is measured): a real head and one agent
# lending `cuda` (a lent node: no Ray on it; its shards come over its work stream into one persistent worker); a
# compute-bound job of 20 shards; the gap between shards on the GPU, the GPU's busy share, against a plain loop.
# Before it, two `run` calls staged the cp312 wheels Farm needs and the image lacks (ray, pyarrow, pydantic, ...) as
# one tar in three parts under 64 MiB (.whl/gpu/c1..c3): this call carries the third (benchmarks/gpu/stage.sh).
. benchmarks/gpu/stage.sh
mkdir -p /tmp/bench && chmod 777 /tmp/bench
# Each queue depth on a head of its own (FARM_QUEUE_DEPTH is read when the head starts): 1 (the default: a worker
# holds its next shard), then 0 (a shard is sent once the one before it is in).
for depth in ${DEPTHS:-1 0}; do
  FARM_QUEUE_DEPTH=$depth farm_head
  farm_agent h200-gpu cuda 8
  echo "== queue depth $depth"
  timeout ${JOB_TIMEOUT_S:-240} python3 benchmarks/gpu/workers.py /tmp/bench/depth$depth ${ARGS:-} 2>&1 | tee $OUT/table-depth$depth.txt
  python3 -c "import json;d=json.load(open('/tmp/bench/depth$depth/workers.json'));print('gaps ms', [round(g,1) for g in d['gaps_ms']])"
  JOB=$(python3 -c "import json;print(json.load(open('/tmp/bench/depth$depth/workers.json'))['job']['id'])" 2>/dev/null)
  [ -n "$JOB" ] && $F job $JOB --explain 2>&1 | head -12
  [ -n "$JOB" ] && $F logs $JOB 2>&1 | grep -c "worker started"
  farm_down
  cp /tmp/bench/depth$depth/workers.json $OUT/workers-depth$depth.json 2>/dev/null
  cp /tmp/farm-state/agents/h200-gpu/agent.log $OUT/agent-depth$depth.log 2>/dev/null
  rm -rf /tmp/farm-state
done
