#!/bin/bash
# Issue 29 on the lent H200: the same inference job untuned, then tuned (tune_budget_s), through a real head and one
# cuda agent, data already on the node (benchmarks/gpu/tuned_job.py prints the table). Staged as data_h200.sh is
# (benchmarks/gpu/stage.sh); a fresh FARM_STATE_DIR, so the tuned job tunes (no winner cached yet on node or head).
# MODEL=convnext runs a model a candidate wins on (tuned_job.py's --model); ROWS sizes the job so tuning pays (the
# data is made once a machine in DATA, default /tmp/bench-tuned: back-to-back calls reuse it); RTOL sets the jobs'
# tolerance (1e-3 lets TF32 products in); WHICH=untuned or tuned runs one of the two jobs, for a pair too long for
# one call.
. benchmarks/gpu/stage.sh
B=benchmarks/gpu/tuned_job.py
D=${DATA:-/tmp/bench-tuned}
[ -f $D/images.npy ] || python3 $B data $D --rows ${ROWS:-262144} | tail -1
cat $D/images.npy > /dev/null  # in the page cache: the jobs are bound by compute, not by reading
farm_up
timeout ${JOB_TIMEOUT_S:-500} python3 $B jobs $D --batch-size ${BATCH:-512} --shards ${SHARDS:-16} \
  --budget ${BUDGET:-120} --model ${MODEL:-resnet18} ${RTOL:+--rtol $RTOL} --which ${WHICH:-both} 2>&1 \
  | tee $OUT/tuned_job.md
JOB=$(grep -o "^tuned job j-[0-9a-f]*\|, tuned job j-[0-9a-f]*" $OUT/tuned_job.md | grep -o "j-[0-9a-f]*")
[ -n "$JOB" ] && $F job $JOB --explain > $OUT/explain.txt 2>&1 && grep -A12 "^tuning" $OUT/explain.txt
farm_down
