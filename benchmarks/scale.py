"""Benchmark 1, scale: a Farm job over a Parquet dataset of a million rows against the same model's plain loop over the
same rows on the same cores; and each worker's peak memory against a 10x smaller dataset.

    python benchmarks/scale.py [--rows 3000000] [--batch-size 1024] [--data DIR]

- Data: benchmarks/pixels.py writes --rows rows (scikit-learn's digits grown with seeded noise: offline) and a tenth
  of them into DIR (default: a temporary folder; kept with --data, and reused when already written).
- Plain loop: one process reading the Parquet files batch by batch with pyarrow, running the digits CNN, writing its
  outputs (row id + logits) to one Parquet file: what a user would write without Farm; run twice, on one torch thread
  and on every core (2 here), and Farm is held against the faster (on a busy 2-core box torch's two threads can be
  slower than one).
- Farm: a head and two agents on 127.0.0.1, each `--cpus 1` (this machine's two cores between them), the job with
  `shards: auto` and `policy: throughput`, outputs as Parquet in the head's output folder. Its rate: rows / wall time
  from submit to the end, as the client sees it (the head's own job wall, first shard to last, beside it).
- Memory: every Ray worker process of the agents is sampled (RSS, every 0.2 s) while each job runs; the peak per
  worker, for the small dataset and for the full one. Streaming means it should not grow with the dataset.
Stops everything it started. The box should be quiet (`uptime`): the goal is a ratio of rates on shared cores.
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

import psutil
from rich.console import Console
from rich.table import Table

from localfarm import ROOT, LocalFarm, report_cleanup  # noqa: E402  (benchmarks/ is the script's path)

sys.path.insert(1, str(ROOT))  # benchmarks/pixels.py imports examples.digits, as the job's code does on the nodes

from datajob import MiB, ensure_dataset, farm_job  # noqa: E402


def plain_loop(data: Path, out: Path, batch_size: int, threads: int) -> dict[str, float]:
    """The model over every row, in this process, on `threads` torch threads; outputs written as Parquet. Run in a
    subprocess."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from pixels import build

    torch.set_num_threads(threads)
    began = time.perf_counter()
    model = build()
    rows = 0
    with pq.ParquetWriter(out, pa.schema([("row_id", pa.int64()), ("logits", pa.list_(pa.float32(), 10))])) as writer:
        for path in sorted(data.glob("*.parquet")):
            for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=["pixels"]):
                pixels = batch.column(0).values.to_numpy(zero_copy_only=False).reshape(-1, 64)
                with torch.inference_mode():
                    logits = model(torch.from_numpy(np.ascontiguousarray(pixels))).numpy()
                ids = pa.array(np.arange(rows, rows + len(logits)), pa.int64())
                writer.write_batch(pa.record_batch([ids, pa.FixedSizeListArray.from_arrays(
                    pa.array(logits.reshape(-1)), 10).cast(pa.list_(pa.float32(), 10))], names=["row_id", "logits"]))
                rows += len(logits)
    seconds = time.perf_counter() - began
    return {"rows": rows, "seconds": seconds, "peak_rss": psutil.Process().memory_info().rss,
            "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--data", type=Path, default=None, help="where the datasets are written (kept)")
    parser.add_argument("--plain-loop", type=Path, help=argparse.SUPPRESS)  # internal: DATA OUT, in a subprocess
    parser.add_argument("--plain-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_loop:
        print(json.dumps(plain_loop(args.plain_loop, args.plain_out, args.batch_size, args.threads)))
        return
    console = Console(width=140)
    scratch = Path(tempfile.mkdtemp(prefix="farm-bench-scale-"))
    data_root = args.data or scratch / "data"
    farm = LocalFarm(agents=2, cpus=1)
    try:
        with console.status(f"writing {args.rows:,} and {args.rows // 10:,} rows of Parquet..."):
            began = time.perf_counter()
            big = ensure_dataset(data_root / f"rows-{args.rows}", args.rows)
            small = ensure_dataset(data_root / f"rows-{args.rows // 10}", args.rows // 10)
        console.print(f"datasets in {data_root} ({time.perf_counter() - began:.1f} s)")
        plains = []
        for threads in sorted({1, psutil.cpu_count(logical=True) or 1}):
            with console.status(f"plain loop over the full dataset on {threads} thread(s)..."):
                done = subprocess.run([sys.executable, __file__, "--plain-loop", str(big), "--plain-out",
                                       str(scratch / "plain.parquet"), "--batch-size", str(args.batch_size),
                                       "--threads", str(threads)], capture_output=True, text=True, check=True, cwd=ROOT)
                plains.append(json.loads(done.stdout.strip().splitlines()[-1]))
            console.print(f"plain loop: {plains[-1]['rows']:,} rows in {plains[-1]['seconds']:.1f} s on {threads} "
                          "thread(s)")
        plain = min(plains, key=lambda p: p["seconds"])  # Farm is held against the faster of the two
        with console.status("starting a head and two agents (--cpus 1 each)..."):
            farm.__enter__()
        jobs = {}
        for name, data in (("scale-small", small), ("scale-full", big)):
            with console.status(f"Farm job over {data.name}..."):
                jobs[name] = farm_job(farm, data, scratch / f"out-{name}", args.batch_size, scratch, name)
            result = jobs[name]
            console.print(f"{name}: {result['rows']:,} rows in {result['wall']:.1f} s ({result['shards']} shards, "
                          f"head's job wall {result['job_wall']:.1f} s); shard sizes: "
                          + ", ".join(f"{n} {s:,}" for n, s in result["sizes"][:12]))
    finally:
        with console.status("stopping the agents and the head..."):
            farm.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    full, small_job = jobs["scale-full"], jobs["scale-small"]
    table = Table(title=f"Scale: {full['rows']:,} Parquet rows, digits CNN, batch {args.batch_size}, this machine's "
                        f"{psutil.cpu_count()} cores")
    for column in ("", "rows", "wall s", "rows/s", "vs plain loop", "goal"):
        table.add_column(column, justify="right")
    plain_rate = plain["rows"] / plain["seconds"]
    for loop in plains:
        rate = loop["rows"] / loop["seconds"]
        table.add_row(f"plain loop (1 process, {loop['threads']} torch thread(s))", f"{loop['rows']:,}",
                      f"{loop['seconds']:.1f}", f"{rate:,.0f}", f"{rate / plain_rate:.2f}x",
                      "the reference (the faster)" if loop is plain else "")
    for label, wall in (("Farm, submit to end (2 agents x 1 CPU)", full["wall"]),
                        ("Farm, head's job wall (first shard to end)", full["job_wall"])):
        rate = full["rows"] / wall
        table.add_row(label, f"{full['rows']:,}", f"{wall:.1f}", f"{rate:,.0f}", f"{rate / plain_rate:.2f}x",
                      ">= 0.90x: " + ("met" if rate / plain_rate >= 0.9 else "not met") if "submit" in label else "")
    console.print(table)
    memory = Table(title="Peak RSS of each Ray worker process of the agents, per job")
    for column in ("agent", "worker pid", f"{small_job['rows']:,} rows, MiB", f"{full['rows']:,} rows, MiB"):
        memory.add_column(column, justify="right")
    for pid in sorted(set(small_job["peak"]) | set(full["peak"])):
        agent = (small_job["peak"].get(pid) or full["peak"][pid])[0]
        cells = [f"{d['peak'][pid][1] / MiB:,.0f}" if pid in d["peak"] else "-" for d in (small_job, full)]
        memory.add_row(agent, str(pid), *cells)
    top_small = max(v for _, v in small_job["peak"].values()) / MiB
    top_full = max(v for _, v in full["peak"].values()) / MiB
    memory.add_row("largest", "", f"{top_small:,.0f}", f"{top_full:,.0f}")
    console.print(memory)
    growth = top_full / top_small - 1
    console.print(f"largest worker: {growth:+.1%} from {small_job['rows']:,} to {full['rows']:,} rows "
                  f"(goal: within 10 %: {'met' if abs(growth) <= 0.10 else 'not met'}); plain loop's own peak RSS "
                  f"{plain['peak_rss'] / MiB:,.0f} MiB. Farm's energy for the full job: {full['energy_j']:,.1f} J "
                  "(model estimate: no RAPL here)")
    report_cleanup(console, [farm])


if __name__ == "__main__":
    main()
