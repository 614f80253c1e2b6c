"""Markdown tables from the job records `farm submit --wait --json` wrote: one row per job (placement, seconds,
energy), then one per shard (node, device, seconds, energy with its source and scope, peak memory).

    python benchmarks/gpu/summarize.py OUT/*.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def main(paths: list[str]) -> None:
    jobs = [(Path(p).stem, json.loads(Path(p).read_text())) for p in paths if Path(p).stat().st_size]
    print("| job | state | placement (shards) | wall s | energy J | items/J | metrics |")
    print("|---|---|---|---:|---:|---:|---|")
    for name, job in jobs:
        shards = job.get("shards", [])
        placement = Counter(f"{s.get('node_name', '?')}:{s.get('device', '?')}" for s in shards)
        wall = float(job.get("finished_at") or 0) - float(job.get("created_at") or 0)  # submit to done
        energy = float(job.get("energy_j", 0) or 0)
        items = sum(int(s.get("stop", 0)) - int(s.get("start", 0)) for s in shards)
        metrics = {k: round(v, 4) for k, v in (job.get("metrics") or {}).items() if "accuracy" in k}
        print(f"| {name} | {job.get('state')} | "
              f"{', '.join(f'{k} ×{n}' for k, n in sorted(placement.items()))} | {wall:.1f} | {energy:.1f} | "
              f"{items / energy if energy else 0:.1f} | {metrics or ''} |")
    print()
    print("| job | shard | node | device | items | s | J | source | scope | peak MiB |")
    print("|---|---:|---|---|---:|---:|---:|---|---|---:|")
    for name, job in jobs:
        for s in job.get("shards", []):
            print(f"| {name} | {s.get('index', 0)} | {s.get('node_name', '?')} | {s.get('device', '?')} | "
                  f"{int(s.get('stop', 0)) - int(s.get('start', 0))} | {float(s.get('seconds', 0)):.3f} | "
                  f"{float(s.get('energy_j', 0)):.2f} | {s.get('energy_source', '')} | {s.get('energy_scope', '')} | "
                  f"{int(s.get('peak_memory_bytes', 0)) // 2**20} |")


if __name__ == "__main__":
    main(sys.argv[1:])
