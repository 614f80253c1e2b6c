#!/bin/bash
# Source this on the lent H200 (`. benchmarks/gpu/stage.sh`) in the call that carries .whl/gpu/c3, after two calls
# that copied .whl/gpu/c1 and c2 into /tmp/parts (the machine is handed back after 30 s idle: back to back). It puts
# the cp312 wheels Farm needs and the image lacks (ray, pyarrow, pydantic, ...; one tar in three parts under 64 MiB,
# made here by benchmarks/gpu/wheels.sh) together, installs them into /tmp/site, and sets PYTHONPATH, PATH and
# FARM_STATE_DIR; then sources farm_up.sh (farm_up, farm_head, farm_agent, farm_down).
export OUT=${OUT:-/tmp/o}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=200
if [ ! -d /tmp/site/ray ]; then
  cp .whl/gpu/c3/* /tmp/parts/ 2>/dev/null
  cat /tmp/parts/wheels.part.aa /tmp/parts/wheels.part.ab /tmp/parts/wheels.part.ac > /tmp/wheels.tar
  mkdir -p /tmp/whl && tar xf /tmp/wheels.tar -C /tmp/whl
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/whl/*.whl 2>&1 | tail -3
fi
export PYTHONPATH=/tmp/site:$PWD:$PWD/agents
mkdir -p /tmp/bin && printf '#!/bin/bash\nexec python3 -m ray.scripts.scripts "$@"\n' > /tmp/bin/ray && chmod +x /tmp/bin/ray
export PATH=/tmp/bin:$PATH FARM_STATE_DIR=/tmp/farm-state
python3 -c "import ray, pyarrow, farm.head.server, farm.data, farm_agent.daemon.main, farm_agent.work.host, pynvml, torch; print('imports ok', ray.__version__, pyarrow.__version__, torch.__version__)" || exit 3
. benchmarks/gpu/farm_up.sh
