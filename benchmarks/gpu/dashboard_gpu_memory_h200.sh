#!/bin/bash
# On the lent H200: the dashboard's GPU memory (issue 20) read from a real agent's NVML, not a recording. A head and
# one agent lending `cuda`; a small torch process holds 8 GiB on the GPU meanwhile; then the dashboard's /api/fleet,
# /api/history and /metrics are saved to $OUT and checked: the node's gpu_memory names cuda:0 with the H200's total
# and at least the 8 GiB held, and the history charts it. Staged as auto_shards_h200.sh is (/tmp/parts, a clean
# `git archive` of the commit under test, run from its root).
REAL_OUT=${OUT:-/tmp/out-final}; export OUT=/tmp/o; mkdir -p $OUT
export PYTHONUNBUFFERED=1 COLUMNS=200
cat /tmp/parts/ray.part.aa /tmp/parts/ray.part.ab > /tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  /tmp/parts/*.whl /tmp/ray-*.whl 2>&1 | tail -3
export PYTHONPATH=/tmp/site:$PWD:$PWD/agents
mkdir -p /tmp/bin && printf '#!/bin/bash\nexec python3 -m ray.scripts.scripts "$@"\n' > /tmp/bin/ray && chmod +x /tmp/bin/ray
export PATH=/tmp/bin:$PATH FARM_STATE_DIR=/tmp/farm-state
F="python3 -m farm.cli.main"
$F head start --host 127.0.0.1 --port 7710 --ray-user root --detach 2>&1 | tail -2
JOIN=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['join_token'])")
CA=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['ca_hash'])")
FARM_JOIN_TOKEN=$JOIN $F agent start --head 127.0.0.1:7710 --ca-hash "$CA" --name h200-gpu --backends cuda --cpus 8 \
  --max-foreign-cpu 100 --ray-user root --detach 2>&1 | tail -1
python3 -c "import torch,time; x=torch.empty(8*2**30, dtype=torch.uint8, device='cuda'); time.sleep(30)" &
HOLDER=$!
sleep 12  # a few heartbeats (2 s) and dashboard samples while the 8 GiB are held
DASH=$(python3 -c "import json;print(json.load(open('/tmp/farm-state/head.json'))['dashboard'])")
for path in api/fleet api/history metrics; do  # over the head's TLS, trusting its CA, with the API token
  python3 - "$DASH$path" > "$OUT/$(basename $path).out" <<'PY'
import json, ssl, sys, urllib.request
from farm.client import find_head
head = find_head()
request = urllib.request.Request(sys.argv[1], headers={"Authorization": f"Bearer {head.api_token}"})
trusted = ssl.create_default_context(cadata=(head.ca_pem or b"").decode())
sys.stdout.write(urllib.request.urlopen(request, context=trusted).read().decode())
PY
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
node = json.load(open(f"{out}/fleet.out"))["nodes"][0]
print("gpu_memory", node["gpu_memory"], "cpu owner/farm", node["owner_cpu_percent"], node["farm_cpu_percent"])
gpu = node["gpu_memory"][0]
assert gpu["device"] == "cuda:0" and gpu["total_bytes"] > 140 * 2**30 and gpu["used_bytes"] >= 8 * 2**30, gpu
charted = json.load(open(f"{out}/history.out"))["nodes"][0]
assert any(v is not None and v >= 5.0 for v in charted["gpu_memory"]), charted.get("gpu_memory")
assert "farm_node_gpu_memory_used_bytes{" in open(f"{out}/metrics.out").read()
print("dashboard GPU memory: ok")
PY
echo "check: $?"
wait $HOLDER
$F agent stop 2>&1 | tail -1; $F head stop 2>&1 | tail -1
cp /tmp/farm-state/agents/*/agent.log $OUT/ 2>/dev/null
mkdir -p $REAL_OUT; cp $OUT/* $REAL_OUT/ 2>/dev/null
