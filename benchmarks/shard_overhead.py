"""What one shard costs beyond its model time, on a local head and one agent: the figure auto-sized shards are sized
against (farm/scheduler/sizing.py SHARD_OVERHEAD_S).

    python benchmarks/shard_overhead.py [--shards 100] [--runs 3]

One agent with one CPU runs one shard at a time, so a job's wall time on the head (its first shard's start to its
end) is the sum over its shards of model time and overhead: overhead per shard = (job wall - summed model time) /
shards. The job is the digits example (540 rows) cut into --shards fixed shards (5-6 rows each: the model time is
tiny, the overhead is what is measured); a first job of 8 shards warms the worker and calibrates, untimed. The
overhead holds the head's order over the node's work stream to its persistent worker (farm.head.links), the
shard's dataset and model from the worker's caches, the warm-up check, the energy window, the result's upload, the
head's atomic write and SQLite record, and the next scheduling round. Stops everything it started.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from farm.client import Client

from localfarm import ROOT, LocalFarm, report_cleanup  # noqa: E402  (benchmarks/ is the script's path)


def run(farm: LocalFarm, spec: dict[str, Any], scratch: Path) -> dict[str, float]:
    from farm.client.preflight import prepare

    assert farm.head is not None
    shutil.rmtree(scratch / "out", ignore_errors=True)
    path = scratch / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    prepared = prepare(path, ROOT)
    with Client(farm.head) as client:
        job_id = client.submit_prepared(prepared)
        job = None
        for job in client.watch(job_id):
            pass
    if job is None or job.state != "succeeded":
        raise RuntimeError(f"job {job_id} ended {job.state if job else '?'}: {job.error if job else ''}")
    wall = job.finished_at - job.started_at
    model = sum(s.seconds for s in job.shards)
    return {"shards": len(job.shards), "wall": wall, "model": model, "overhead": (wall - model) / len(job.shards)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    console = Console(width=130)
    scratch = Path(tempfile.mkdtemp(prefix="farm-bench-overhead-"))
    spec = yaml.safe_load((ROOT / "examples/digits/infer.yaml").read_text())
    spec.update(policy="throughput", output=str(scratch / "out"))
    farm = LocalFarm(agents=1, cpus=1)
    results = []
    try:
        with console.status("starting a head and one agent (--cpus 1)..."):
            farm.__enter__()
        with console.status("warm-up job (8 shards, untimed)..."):
            run(farm, {**spec, "shards": 8}, scratch)
        for i in range(1, args.runs + 1):
            with console.status(f"run {i}/{args.runs}: {args.shards} shards..."):
                result = run(farm, {**spec, "shards": args.shards}, scratch)
            results.append(result)
            console.print(f"run {i}: {result['shards']} shards, head's job wall {result['wall']:.3f} s, model time "
                          f"{result['model']:.3f} s, overhead {result['overhead'] * 1000:.1f} ms per shard")
    finally:
        with console.status("stopping the agent and the head..."):
            farm.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    table = Table(title=f"Per-shard overhead: digits in {args.shards} shards on 1 agent x 1 CPU, {args.runs} runs")
    for column in ("", "median", "min", "max"):
        table.add_column(column, justify="right")
    for name, key, scale, unit in (("job wall", "wall", 1, "s"), ("summed model time", "model", 1, "s"),
                                   ("overhead per shard", "overhead", 1000, "ms")):
        values = [r[key] * scale for r in results]
        table.add_row(name, *(f"{v:.3f} {unit}" for v in (statistics.median(values), min(values), max(values))))
    console.print(table)
    report_cleanup(console, [farm])


if __name__ == "__main__":
    main()
