#!/bin/bash
# Issue 29's whole-model suite (benchmarks/kernels/models) on the lent GPU, in one call: each model tuned by
# benchmarks/kernels/tune_models.py under the energy objective (every candidate's ms and J per call), then the
# suite's goals against torch.compile. No Ray, no head: the optimizer on the bare GPU, so only pydantic is installed
# (benchmarks/gpu/pydantic.sh, from a .whl/pyd carry). Env: ONLY (model names), BUDGET (s per model, default 75),
# LIMIT_S (start no model after it, default 480), RTOL (default 1e-4), FAMILIES (default: the rivals below).
# Writes $OUT/models.json, $OUT/models.log and $OUT/policy.json (what the suite taught the tuner's policy: copy
# it to a node's ~/.farm/tuner/policy.json and its first job searches in that order).
# Run from the repository root:  bash benchmarks/gpu/models_h200.sh
OUT=${OUT:-/tmp/models-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FARM_STATE_DIR=/tmp/farm-models-state
. benchmarks/gpu/pydantic.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
FAMILIES=${FAMILIES:-"compile-default cuda-graph channels-last triton-templates-3xtf32 triton-templates-3xtf32-graph triton-templates-3xtf32-compile-graph"}
ARGS=(--budget-s "${BUDGET:-75}" --rtol "${RTOL:-1e-4}" --time-limit-s "${LIMIT_S:-480}" --families $FAMILIES
      --out "$OUT/models.json" --policy "$OUT/policy.json")
[ -n "$ONLY" ] && ARGS+=(--only $ONLY)
timeout ${RUN_TIMEOUT_S:-585} python3 benchmarks/kernels/tune_models.py "${ARGS[@]}" > "$OUT/models.log" 2>&1
echo "== tune_models.py rc=$? after $SECONDS s"
grep -v "Warning\|warn" "$OUT/models.log" | tail -120
