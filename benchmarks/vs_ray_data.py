"""Benchmark 2: Farm side by side with Ray Data on the same rows, model and cores, in one run: rows/s and joules.

    python benchmarks/vs_ray_data.py [--rows 3000000] [--batch-size 1024] [--data DIR]

- Data and model: benchmarks/pixels.py (scikit-learn's digits grown to --rows rows of Parquet; the digits CNN).
- Farm: a head and two agents on 127.0.0.1, each `--cpus 1`, the job with `shards: auto`, `policy: throughput`,
  outputs written as Parquet by the head. Rows/s: rows / (submit to the end, as the client sees it).
- Ray Data, in a process of its own after Farm's cluster is stopped: `ray.init(num_cpus=4)` (two logical CPUs for
  the two model actors, two for Ray Data's read tasks, which otherwise wait for a CPU the actors hold: this machine
  has 2 cores either way), then `ray.data.read_parquet(DIR).map_batches(Predict, concurrency=2, num_cpus=1,
  batch_size=B, batch_format="pyarrow").write_parquet(OUT)`, each actor on one torch thread as Farm's shards are.
  Rows/s: rows / (pipeline built to outputs written; ray.init apart).
- Joules, like for like: each side's Ray worker processes' CPU seconds x Farm's CPU model (rated package watts per
  logical core; this machine has no RAPL): a model estimate. Farm's own figure beside it: the sum of its shards'
  energy windows (the same model over the shards' own CPU time: reading and writing outside the window not billed).
Stops everything it started. The box should be quiet (`uptime`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from localfarm import ROOT, LocalFarm, report_cleanup  # noqa: E402  (benchmarks/ is the script's path)

sys.path.insert(1, str(ROOT))  # benchmarks/pixels.py imports examples.digits, as the job's code does on the nodes

from datajob import ensure_dataset, farm_job, is_ray_worker, watts_per_core  # noqa: E402


def ray_data_run(data: Path, out: Path, batch_size: int) -> dict[str, Any]:
    """Ray Data over the same rows, in this process (run in a subprocess: a Ray cluster of its own)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    began = time.perf_counter()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{ROOT}:{ROOT / 'benchmarks'}"}})
    init_s = time.perf_counter() - began

    class Predict:
        def __init__(self) -> None:
            import torch

            from pixels import build

            torch.set_num_threads(1)
            self.torch, self.model = torch, build()

        def __call__(self, batch: pa.Table) -> pa.Table:
            pixels = batch.column("pixels").combine_chunks().values.to_numpy(zero_copy_only=False).reshape(-1, 64)
            with self.torch.inference_mode():
                logits = self.model(self.torch.from_numpy(np.ascontiguousarray(pixels))).numpy()
            return pa.table({"logits": pa.FixedSizeListArray.from_arrays(pa.array(logits.reshape(-1)), 10)})

    def workers_cpu() -> dict[int, float]:
        found = {}
        for proc in psutil.Process().children(recursive=True):
            if is_ray_worker(proc):
                try:
                    times = proc.cpu_times()
                except psutil.Error:
                    continue
                found[proc.pid] = times.user + times.system
        return found

    before = workers_cpu()
    began = time.perf_counter()
    ray.data.read_parquet(str(data), columns=["pixels"]).map_batches(
        Predict, concurrency=2, num_cpus=1, batch_size=batch_size, batch_format="pyarrow",
    ).write_parquet(str(out))
    seconds = time.perf_counter() - began
    after = workers_cpu()
    rows = sum(pq.read_metadata(p).num_rows for p in out.glob("*.parquet"))
    cpu = sum(value - before.get(pid, 0.0) for pid, value in after.items())
    ray.shutdown()
    return {"rows": rows, "seconds": seconds, "init_s": init_s, "cpu_seconds": cpu, "version": ray.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--data", type=Path, default=None, help="where the dataset is written (kept)")
    parser.add_argument("--ray-data", type=Path, help=argparse.SUPPRESS)  # internal: DATA, in a subprocess
    parser.add_argument("--ray-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ray_data:
        print(json.dumps(ray_data_run(args.ray_data, args.ray_out, args.batch_size)))
        return
    console = Console(width=140)
    scratch = Path(tempfile.mkdtemp(prefix="farm-bench-raydata-"))
    data = ensure_dataset((args.data or scratch / "data") / f"rows-{args.rows}", args.rows)
    farm = LocalFarm(agents=2, cpus=1)
    try:
        with console.status("starting a head and two agents (--cpus 1 each)..."):
            farm.__enter__()
        with console.status("Farm job..."):
            farmed = farm_job(farm, data, scratch / "out-farm", args.batch_size, scratch, "vs-ray-data")
        console.print(f"Farm: {farmed['rows']:,} rows in {farmed['wall']:.1f} s, {farmed['shards']} shards")
        with console.status("stopping Farm..."):
            farm.stop()
        with console.status("Ray Data..."):
            done = subprocess.run([sys.executable, __file__, "--ray-data", str(data), "--ray-out",
                                   str(scratch / "out-ray"), "--batch-size", str(args.batch_size)],
                                  capture_output=True, text=True, cwd=ROOT, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"Ray Data run failed: {done.stderr.strip().splitlines()[-3:]}")
        rayed = json.loads(done.stdout.strip().splitlines()[-1])
        console.print(f"Ray Data {rayed['version']}: {rayed['rows']:,} rows in {rayed['seconds']:.1f} s "
                      f"(ray.init {rayed['init_s']:.1f} s apart)")
    finally:
        farm.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    per_core = watts_per_core()
    table = Table(title=f"Farm and Ray Data: {farmed['rows']:,} Parquet rows, digits CNN, batch {args.batch_size}, "
                        f"{psutil.cpu_count()} cores")
    for column in ("", "rows", "wall s", "rows/s", "workers' CPU s", "J (workers' CPU x model)", "rows/J",
                   "J (Farm's shard meters)"):
        table.add_column(column, justify="right")
    for label, result, wall, shard_j in (
        ("Farm (2 agents x 1 CPU, shards: auto)", farmed, farmed["wall"], f"{farmed['energy_j']:,.1f} (model est.)"),
        ("Ray Data (2 actors x 1 CPU)", rayed, rayed["seconds"], "-"),
    ):
        joules = result["cpu_seconds"] * per_core
        table.add_row(label, f"{result['rows']:,}", f"{wall:.1f}", f"{result['rows'] / wall:,.0f}",
                      f"{result['cpu_seconds']:.1f}", f"{joules:,.1f} (model est.)",
                      f"{result['rows'] / joules:,.0f}" if joules else "-", shard_j)
    console.print(table)
    ratio = (farmed["rows"] / farmed["wall"]) / (rayed["rows"] / rayed["seconds"])
    console.print(f"Farm / Ray Data, rows/s: {ratio:.2f}x (goal: at least as fast: {'met' if ratio >= 1 else 'not met'})."
                  f" Joules are a model estimate ({per_core:.1f} W per busy core-second: no RAPL on this machine).")
    report_cleanup(console, [farm])


if __name__ == "__main__":
    main()
