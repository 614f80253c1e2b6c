#!/bin/bash
# Kernel evaluation through Farm on the lent H200, then the optimizer over the problems a time budget left out before.
#  1. a real head, Ray and one agent lending `cuda`; `farm submit benchmarks/kernels/eval.yaml --wait` (every problem
#     with candidates in benchmarks/kernels/candidates/, including one that crashes and one that hangs), then
#     `farm kernels results JOB`: the results table;
#  2. with what is left of the call's 540 s, benchmarks/kernels/tune_h200.py over the problems named in $TUNE
#     (no Ray: the optimizer on the bare GPU), as docs/kernels-h200.md ran the first 23.
# Before it, a `run` call staged in /tmp/parts ray.part.aa and the small cp312 wheels; this call carries ray.part.ab,
# the wheels Farm added since (cryptography, cffi, pycparser, uvloop) and a `git archive` of the commit under test,
# unpacked in /tmp/farm and run from there.
START=$(date +%s)
REAL_OUT=${OUT:-/tmp/out-final}; export OUT=/tmp/o; mkdir -p $OUT
export PYTHONUNBUFFERED=1 COLUMNS=200
cat /tmp/parts/ray.part.aa /tmp/parts/ray.part.ab > /tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  /tmp/parts/*.whl /tmp/ray-*.whl 2>&1 | tail -3
export PYTHONPATH=/tmp/site:$PWD:$PWD/agents
mkdir -p /tmp/bin && printf '#!/bin/bash\nexec python3 -m ray.scripts.scripts "$@"\n' > /tmp/bin/ray && chmod +x /tmp/bin/ray
export PATH=/tmp/bin:$PATH FARM_STATE_DIR=/tmp/farm-state
python3 -c "import ray, farm.head.server, farm.cli.head, farm_agent.main, farm_agent.kernel_eval, torch; print('imports ok', ray.__version__, torch.__version__)" || exit 3
F="python3 -m farm.cli.main"
$F head start --host 127.0.0.1 --port 7710 --detach 2>&1 | tail -2
JOIN=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['join_token'])")
$F agent start --head 127.0.0.1:7710 --token "$JOIN" --name h200-gpu --backends cuda --detach 2>&1 | tail -1
sed "s/^  timeout_s: .*/  timeout_s: ${CANDIDATE_TIMEOUT_S:-120}/; s/^  runs: .*/  runs: ${RUNS:-20}/" benchmarks/kernels/eval.yaml > /tmp/eval.yaml
timeout ${JOB_TIMEOUT_S:-420} $F submit /tmp/eval.yaml --wait --json > $OUT/eval-job.json 2> $OUT/eval-job.err; echo "== eval rc=$?"
tail -3 $OUT/eval-job.err
JOB=$(python3 -c "import json;print(json.load(open('$OUT/eval-job.json'))['id'])")
$F kernels results $JOB --json > $OUT/eval-results.json
$F kernels results $JOB | tee $OUT/eval-results.txt
$F agent stop 2>&1 | tail -1; $F head stop 2>&1 | tail -1
LEFT=$((540 - ($(date +%s) - START)))
echo "== tune: $LEFT s left"
if [ -n "$TUNE" ] && [ $LEFT -gt 60 ]; then
  cp benchmarks/kernels/h200-policy.json /tmp/policy.json  # the policy as the first 23 problems left it
  FARM_STATE_DIR=/tmp/fs timeout $LEFT python3 benchmarks/kernels/tune_h200.py $TUNE --exhaustive \
    --skip compile-max-autotune compile-tf32 triton-fused-tf32 autocast-bf16 --time-limit-s $((LEFT - 90)) \
    --candidate-timeout-s 90 --policy /tmp/policy.json --out $OUT/h200-rest.json 2>&1 | tail -25
fi
mkdir -p $REAL_OUT; cp $OUT/eval-job.json $OUT/eval-results.json $OUT/eval-results.txt $REAL_OUT/ 2>/dev/null
cp $OUT/h200-rest.json $REAL_OUT/ 2>/dev/null; cp /tmp/farm-state/head.log $REAL_OUT/ 2>/dev/null; true
