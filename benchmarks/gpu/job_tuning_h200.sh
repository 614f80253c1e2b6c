#!/bin/bash
# Issue 29 on the lent GPU machine: a job's tuning run alone (benchmarks/gpu/job_tuning.py), for each tolerance in
# RTOL (default "1e-4 1e-3") at BUDGET s (default 45); where OLD names a tarball of an older commit (`git archive
# --format=tar.gz -o .whl/old/old.tgz <commit>`, carried as .whl/old), the same runs on that code in the same call.
# Staged as the other benchmarks are (benchmarks/gpu/stage.sh). Writes $OUT/job_tuning.txt.
. benchmarks/gpu/stage.sh >/dev/null || exit 3
ARGS="--budget ${BUDGET:-45} --rtol ${RTOL:-1e-4 1e-3} --model ${MODEL:-convnext}"
timeout ${RUN_TIMEOUT_S:-250} python3 benchmarks/gpu/job_tuning.py $ARGS --label new 2>&1 | tee -a $OUT/job_tuning.txt
if [ -n "$OLD" ]; then
  rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf "$OLD" -C /tmp/old && cp benchmarks/gpu/job_tuning.py /tmp/old/benchmarks/gpu/
  (cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old:/tmp/old/agents FARM_STATE_DIR=/tmp/farm-state-old \
    timeout ${RUN_TIMEOUT_S:-250} python3 benchmarks/gpu/job_tuning.py $ARGS --label old) 2>&1 | tee -a $OUT/job_tuning.txt
fi
