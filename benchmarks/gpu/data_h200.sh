#!/bin/bash
# Issue 28 on the lent H200: (1) the head's DataService to one node on loopback (benchmarks/data_service.py: where
# the time goes, against the page cache and a bare gRPC stream); (2) a big .npy through the head into a `cuda` job
# with `shards: auto` against the GPU's raw rate in a plain loop (benchmarks/gpu/auto_shards.py). Two calls before
# it staged .whl/gpu/c1 and c2 in /tmp/parts; this one carries c3 (benchmarks/gpu/stage.sh).
. benchmarks/gpu/stage.sh
nproc; free -g | head -2
timeout 200 python3 benchmarks/data_service.py --mib ${MIB:-2048} --repeat 2 2>&1 | tee $OUT/data_service.txt | tail -40
B=benchmarks/gpu/auto_shards.py
python3 $B data /tmp/bench-data --rows ${ROWS:-400000} | tail -1
python3 $B raw /tmp/bench-data --batch-size ${BATCH:-512} | tee $OUT/raw.json
farm_up
timeout ${JOB_TIMEOUT_S:-240} python3 $B job /tmp/bench-data --raw $OUT/raw.json --batch-size ${BATCH:-512} 2>&1 | tee $OUT/table.md
JOB=$(grep -o "^job j-[0-9a-f]*" $OUT/table.md | cut -d' ' -f2)
[ -n "$JOB" ] && $F job $JOB --explain > $OUT/explain.txt 2>&1 && head -30 $OUT/explain.txt
farm_down
