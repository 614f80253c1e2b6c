#!/bin/bash
# The kernel optimizer on the lent H200, in one command of about 9 minutes (no Ray, no head: the optimizer on the
# bare GPU; the image's Python 3.12, torch and Triton, and pydantic from .whl/pyd):
#   1. benchmarks/kernels/template_check.py inside tune_h200.py: every problem's template regions compiled and
#      checked against eager in 12 processes (failures recorded, never fatal), warming Triton's and Inductor's caches;
#   2. benchmarks/kernels/tune_h200.py: every problem (template-covered ones first) measured by the hardened
#      evaluator, one at a time, until the time limit; strict, strict-ieee and loose tables with fast_1.05, geomeans
#      vs eager and compile, each winner's share of the speed of light, the search time; then, if time is left,
#      compile max-autotune as a further baseline.
# Writes under $OUT: h200.json (every trial, the template check), strict.txt, strict-ieee.txt, loose.txt, summary.txt,
# run.log, device.txt. Env: LIMIT_S (start no problem after it, default 510), CHECK_S (template check, default 180),
# WORKERS (check processes, default 12), RUNS (timed runs per candidate, default 10), FAMILIES (candidate families,
# default tune_h200.py's), ONLY (problem names: only these, e.g. the ones a first run's time limit left out),
# OBJECTIVE=energy (each candidate's joules per call read too, ~2 s more each: tables under both objectives, the
# energy ones as strict-energy.txt and so on), TABLES (the tables' folder, default $OUT: an energy run's ten files
# are more than a call brings back, so TABLES=/tmp/tables keeps them out of it), MAX_AUTOTUNE=0 (no max-autotune
# baseline after the problems). Runs in parts (ONLY=...) make one set of tables here:
#   python3 benchmarks/kernels/tune_h200.py --merge part1/h200.json part2/h200.json --tables DIR
# Run from the repository root:  bash benchmarks/gpu/kernels_on_h200.sh
OUT=${OUT:-/tmp/kernels-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=220 FARM_STATE_DIR=/tmp/farm-kernels-state
. benchmarks/gpu/pydantic.sh
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
  python3 -c "import sys, torch, triton, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'cuda', torch.cuda.is_available())" 2>&1
  nproc
} | tee "$OUT/device.txt"
python3 -c "import farm_agent.tuner.tune, farm_agent.tuner.templates.matcher" \
  || { echo "imports failed: see above"; exit 3; }
FAM=()
[ -n "$FAMILIES" ] && FAM=(--families $FAMILIES)
[ -n "$ONLY" ] && FAM+=(--only $ONLY)
timeout 570 python3 benchmarks/kernels/tune_h200.py benchmarks/kernels/problems \
  --time-limit-s "${LIMIT_S:-510}" --check-workers "${WORKERS:-12}" --check-limit-s "${CHECK_S:-180}" \
  --runs "${RUNS:-10}" --objective "${OBJECTIVE:-time}" \
  --candidate-timeout-s 90 $([ "${MAX_AUTOTUNE:-1}" = 0 ] || echo --max-autotune) "${FAM[@]}" \
  --out "$OUT/h200.json" --tables "${TABLES:-$OUT}" > "$OUT/run.log" 2>&1
echo "== tune_h200.py rc=$? after $SECONDS s"
grep -v "^    " "$OUT/run.log" | grep -E "^(==|check:|[a-z0-9_]+: (strict|not))" | tail -70
for t in loose strict-ieee strict loose-energy strict-ieee-energy strict-energy summary; do
  echo "== $t"; cat "${TABLES:-$OUT}/$t.txt" 2>/dev/null
done
true
