"""Issue 27's benchmark, on the lent GPU machine: how long a GPU waits between two shards of a job in Farm's persistent
workers, and how busy it is over the job. Run by benchmarks/gpu/workers_h200.sh (a head and a cuda agent already up,
FARM_STATE_DIR set); prints a table and writes it as JSON.

    python benchmarks/gpu/workers.py DIR [--rows 786432] [--shards 40] [--depth 32]

The job: 40 shards of ~1.6 s each on one H200 (the first one's worker start, CUDA's and the model's, is part of the
job's wall). The model, compute-bound on purpose: 256 inputs → 8192 wide, then one 8192 × 8192 Linear + ReLU applied `depth` times
(shared weights: 256 MB, the work of a deep MLP), → 16 outputs; fp32 as PyTorch runs it by default. The data: `rows`
seeded random rows of 256 float32, made by the job's own dataset callable (loaded once per worker: no data plane in
the way; the data path has its own benchmarks). Batch 1024.

Each forward call appends its time (perf_counter, one process) and rows to a file: within a shard, consecutive calls
are one batch apart (the runner takes each batch's outputs to the host, a sync); a shard's last batch is short (the
shard sizes are not multiples of 1024), and the call after it is the next shard's first, so the gap between shards is
that interval less the short batch's own compute (the median full batch's, scaled by its rows). GPU busy: NVML's
utilisation (the share of time a kernel ran), read every 100 ms from the job's first forward to its last, and over the
job's whole wall (submit to done). The plain loop: the same model and data in one process, warm, synchronised at the
end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BATCH = 1024

JOB_CODE = '''
import os, time
import numpy as np
import torch
from torch import nn

class Deep(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.inp, self.body, self.out, self.depth = nn.Linear(256, 8192), nn.Linear(8192, 8192), nn.Linear(8192, 16), depth
        self.log = open(os.environ["CALLS_FILE"], "a", buffering=1)

    def forward(self, x):
        self.log.write(f"{time.perf_counter():.6f} {x.shape[0]} {os.getpid()}\\n")
        h = torch.relu(self.inp(x))
        for _ in range(self.depth):
            h = torch.relu(self.body(h))
        return self.out(h)

def build():
    torch.manual_seed(0)
    return Deep(int(os.environ["DEPTH"]))

def rows():
    return np.random.default_rng(0).standard_normal((int(os.environ["ROWS"]), 256), dtype=np.float32)
'''


def plain_loop(rows: int, depth: int, work: Path) -> float:
    """Rows/s of the same model over the same rows in one warm process, on cuda:0."""
    code = textwrap.dedent(f"""
        import os, sys, time, torch
        os.environ.update(CALLS_FILE=os.devnull, DEPTH="{depth}", ROWS="{rows}")
        sys.path.insert(0, {str(work)!r})
        import benchjob
        model = benchjob.build().cuda().eval()
        data = torch.from_numpy(benchjob.rows())
        with torch.inference_mode():
            for i in range(0, 4 * {BATCH}, {BATCH}):
                model(data[i:i + {BATCH}].cuda()).cpu()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for i in range(0, len(data), {BATCH}):
                model(data[i:i + {BATCH}].cuda(non_blocking=True)).cpu()
            torch.cuda.synchronize()
        print(len(data) / (time.perf_counter() - start))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


class Sampler(threading.Thread):
    """NVML utilisation of GPU 0 every 100 ms, with the time read."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.readings: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.readings.append((time.time(), self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
            time.sleep(0.1)

    def mean(self, start: float, end: float) -> float:
        inside = [u for t, u in self.readings if start <= t <= end]
        return statistics.fmean(inside) if inside else float("nan")


def gaps(calls: list[tuple[float, int]]) -> tuple[list[float], float]:
    """The gaps between shards (seconds) and the median full batch's interval, from the forward calls in order."""
    intervals = [(b[0] - a[0], a[1]) for a, b in zip(calls, calls[1:])]
    full = statistics.median(d for d, n in intervals if n == BATCH)
    return [max(d - full * n / BATCH, 0.0) for d, n in intervals if n < BATCH], full


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--rows", type=int, default=786_432)
    parser.add_argument("--shards", type=int, default=40)
    parser.add_argument("--depth", type=int, default=32)
    args = parser.parse_args()
    work = args.dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "benchjob.py").write_text(JOB_CODE)
    calls_file = args.dir / "calls.txt"
    calls_file.unlink(missing_ok=True)
    spec = args.dir / "workers.yaml"
    spec.write_text(textwrap.dedent(f"""
        name: workers-bench
        kind: inference
        model: benchjob:build
        dataset: benchjob:rows
        shards: {args.shards}
        batch_size: {BATCH}
        backends: [cuda]
        output: {args.dir / 'out'}
        env: {{CALLS_FILE: {calls_file}, DEPTH: "{args.depth}", ROWS: "{args.rows}"}}
    """))
    sampler = Sampler()
    sampler.start()
    submitted = time.time()
    farm = [sys.executable, "-m", "farm.cli.main"]
    done = subprocess.run([*farm, "submit", str(spec), "--wait", "--json", "--no-check", "--overwrite",
                           "--workdir", str(work)], capture_output=True, text=True, cwd=ROOT)
    ended = time.time()
    sampler.stop.set()
    if done.returncode:
        raise SystemExit(done.stderr)
    job = json.loads(done.stdout)
    lines = [line.split() for line in calls_file.read_text().splitlines()]
    pids = {pid for _, _, pid in lines}
    calls = [(float(t), int(n)) for t, n, _ in lines]
    found, full = gaps(calls)
    # The forward calls' span in wall time: perf_counter is this machine's monotonic clock, time.time its wall clock;
    # the job record's started_at/finished_at bound it.
    compute_s = sum(s["seconds"] for s in job["shards"])
    wall_s = job["finished_at"] - job["started_at"]
    plain = plain_loop(min(args.rows, 262_144), args.depth, work)  # its rate: a quarter-million rows tell it
    table = {
        "shards": len(job["shards"]), "rows": job["items"], "workers (pids)": len(pids),
        "model builds": len(pids),
        "job wall, started→finished (s)": round(wall_s, 3),
        "job wall, submit→done (s)": round(ended - submitted, 3),
        "shards' compute, summed (s)": round(compute_s, 3),
        "compute / job wall": round(compute_s / wall_s, 4),
        "GPU util, NVML mean over started→finished (%)": round(sampler.mean(job["started_at"], job["finished_at"]), 1),
        "GPU util, NVML mean over submit→done (%)": round(sampler.mean(submitted, ended), 1),
        "median full batch (ms)": round(full * 1000, 2),
        "gaps between shards (n)": len(found),
        "median gap between shards (ms)": round(statistics.median(found) * 1000, 1) if found else None,
        "p90 gap (ms)": round(sorted(found)[int(0.9 * (len(found) - 1))] * 1000, 1) if found else None,
        "max gap (ms)": round(max(found) * 1000, 1) if found else None,
        "rows/s, job (started→finished)": round(job["items"] / wall_s),
        "rows/s, plain loop (one warm process)": round(plain),
        "job / plain loop": round(job["items"] / wall_s / plain, 3),
    }
    width = max(map(len, table))
    for key, value in table.items():
        print(f"{key:<{width}}  {value}")
    (args.dir / "workers.json").write_text(json.dumps({"table": table, "gaps_ms": [g * 1000 for g in found],
                                                       "job": job}, indent=1))


if __name__ == "__main__":
    main()
