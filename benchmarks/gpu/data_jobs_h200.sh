#!/bin/bash
# Issue 28's three job shapes on the lent H200, each by a plain loop, a DataLoader, Ray Data and Farm (through the
# head's data service, and with `shared: true`), with NVML's energy and the GPU's utilisation through each
# (benchmarks/gpu/data_jobs.py). Two calls before it staged .whl/gpu/c1 and c2 in /tmp/parts; this one carries c3
# (benchmarks/gpu/stage.sh). A call runs 600 s at most: SHAPES picks the shapes of this call (default all three),
# SCALE the datasets' sizes (1: a million Parquet rows, 65,536 PNGs, a 6.4 GB .npy); the data stays in /tmp while
# the machine is held, so back-to-back calls can split the shapes. FARM_TIMEOUT_S bounds Farm's ways (default 400 s)
# so that the head and agent are stopped and their logs copied inside the call's 600 s; BASE=none runs Farm's ways only,
# BASE_WAYS picks the ways before Farm (default: plain loader ray); WARM=model runs each model once in the loops'
# process before their windows (data_jobs.py warm(); default: the device's set-up only, as Farm's warm worker).
. benchmarks/gpu/stage.sh
D=/tmp/data-jobs B=benchmarks/gpu/data_jobs.py SHAPES=${SHAPES:-parquet images npy}
nproc; free -g | head -2; nvidia-smi --query-gpu=name,power.draw --format=csv,noheader
python3 $B data $D --scale "${SCALE:-1}" --shapes $SHAPES | tail -1
# One idle draw for every way, read before Farm is up: its agent keeps a warm worker's CUDA context on the GPU.
IDLE=$(python3 $B idle $D | tail -1); echo "idle W: $IDLE"
[ "${BASE:-}" != none ] && python3 $B run $D --shapes $SHAPES --ways ${BASE_WAYS:-plain loader ray} --workers 8 --idle-w $IDLE --warm ${WARM:-device} 2>&1 | grep '^{' | tee -a $OUT/rows.jsonl
farm_up
timeout ${FARM_TIMEOUT_S:-400} python3 $B run $D --shapes $SHAPES --ways ${FARM_WAYS:-farm farm-shared} --workers 8 --idle-w $IDLE 2>&1 | grep '^{' | tee -a $OUT/rows.jsonl
for job in $(grep -o '"job": "j-[0-9a-f]*"' $OUT/rows.jsonl | cut -d'"' -f4); do  # where each Farm job's time went
  $F job "$job" --explain > "$OUT/explain-$job.txt" 2>&1
  $F logs "$job" > "$OUT/logs-$job.txt" 2>&1  # its timeline, to the millisecond: dispatches, worker, shards' ends
done
farm_down
python3 $B table $D | tee $OUT/data_jobs.md
cp $D/results.jsonl $OUT/
