"""How a job's wall time scales from one local agent to two.

    python benchmarks/scaling.py [--job digits|embeddings] [--runs 3]

For 1 and then 2 agents (each `--cpus 1`: this machine has 2 cores), a fresh head and agents on 127.0.0.1; the job
(a temporary copy of its spec with `policy: throughput`, so the scheduler spreads for the shortest makespan) is
prepared once (preflight + zip, not timed) and then submitted --runs times. Timed per run: submit to the job's end as
the client sees it (Client.submit + Client.watch), and the head's own job wall (first shard start to finish). Each
fresh farm calibrates from nothing, so its first run includes calibration and Ray worker start-up; every run is
listed. Speedup = median wall on 1 agent / median wall on 2. Stops everything it started.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from farm.client import Client

from localfarm import JOBS, ROOT, LocalFarm, report_cleanup  # noqa: E402  (benchmarks/ is the script's path)



def run_job(farm: LocalFarm, prepared: Any) -> dict[str, Any]:
    assert farm.head is not None
    with Client(farm.head) as client:
        began = time.perf_counter()
        job_id = client.submit_prepared(prepared, overwrite=True)  # the same job again
        job = None
        for job in client.watch(job_id):
            pass
        wall = time.perf_counter() - began
    if job is None or job.state != "succeeded":
        raise RuntimeError(f"job {job_id} ended {job.state if job else '?'}: {job.error if job else ''}")
    return {"wall": wall, "job_wall": job.finished_at - job.started_at, "nodes": {s.node_name for s in job.shards}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", choices=sorted(JOBS), default="digits")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    console = Console(width=130)
    from farm.client.preflight import prepare

    scratch = Path(tempfile.mkdtemp(prefix="farm-bench-scaling-"))
    spec = yaml.safe_load((ROOT / JOBS[args.job]).read_text())
    spec.update(policy="throughput", output=str(scratch / "out"))
    spec_path = scratch / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    results: dict[int, list[dict[str, Any]]] = {}
    farms: list[LocalFarm] = []
    try:
        prepared = prepare(spec_path, ROOT)
        for agents in (1, 2):
            with console.status(f"starting a head and {agents} agent(s) (--cpus 1 each)..."):
                farm = LocalFarm(agents=agents, cpus=1)
                farms.append(farm)
                farm.__enter__()
            try:
                results[agents] = []
                for run in range(1, args.runs + 1):
                    with console.status(f"{agents} agent(s): run {run}/{args.runs}..."):
                        shutil.rmtree(scratch / "out", ignore_errors=True)
                        result = run_job(farm, prepared)
                    results[agents].append(result)
                    console.print(f"{agents} agent(s), run {run}: {result['wall']:.2f} s "
                                  f"(head's job wall {result['job_wall']:.2f} s) on {len(result['nodes'])} node(s)")
            finally:
                with console.status("stopping the agents and the head..."):
                    farm.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    items = prepared.items
    table = Table(title=f"{args.job} ({JOBS[args.job]}, policy: throughput, {prepared.spec.shards} shards of {items} "
                        f"items): wall time, submit to end, over {args.runs} runs")
    for column in ("agents (x 1 CPU)", "median s", "min s", "max s", "runs (s)", "head's job wall, median s",
                   "items/s", "nodes used", "speedup"):
        table.add_column(column, justify="right")
    base = statistics.median(r["wall"] for r in results[1])
    for agents, runs in results.items():
        walls = [r["wall"] for r in runs]
        med = statistics.median(walls)
        table.add_row(str(agents), f"{med:.2f}", f"{min(walls):.2f}", f"{max(walls):.2f}",
                      ", ".join(f"{w:.2f}" for w in walls), f"{statistics.median(r['job_wall'] for r in runs):.2f}",
                      f"{items / med:,.0f}", str(max(len(r["nodes"]) for r in runs)), f"{base / med:.2f}x")
    console.print(table)
    console.print("speedup = median wall on 1 agent / median wall here (ideal: 2.00x on 2 agents). The prepare step "
                  "(preflight + zip) runs once, before timing.")
    report_cleanup(console, farms)


if __name__ == "__main__":
    main()
