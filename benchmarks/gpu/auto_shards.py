"""Benchmark 3, on the lent GPU machine: a job of its own on a `cuda` agent with `shards: auto`: the job's rows/s
against the GPU's raw rate for the same model, and the sum of its shards' energies against NVML's counter over the
whole job. Run by benchmarks/gpu/auto_shards_h200.sh (a head and a cuda agent already up, FARM_STATE_DIR set).

    python benchmarks/gpu/auto_shards.py data DIR [--rows 400000]     # the dataset (seeded, on the machine)
    python benchmarks/gpu/auto_shards.py raw DIR [--batch-size 512]   # the GPU's raw rate, in a process of its own
    python benchmarks/gpu/auto_shards.py job DIR --raw RAW.json       # the Farm job, NVML sampled around it; table

The model: a ResNet-18-shaped CNN (BasicBlocks 64-128-256-512, written here: no torchvision on the machine) on
3x64x64 uint8 images scaled to [0, 1] on the GPU, seeded weights (the rate and the energy are what is measured, not
the predictions). The data: --rows random images in one .npy file (memory-mapped by the data plane; column `data`).
Raw rate: the same model, batch size and rows, in a plain loop reading the same .npy (memory-mapped), each batch
copied to the GPU, synchronised at the end; warm-up batches apart.
Energy: a thread reads NVML's total-energy counter every 50 ms for the whole run; the counter's joules over the job
(its first shard's start to its end, interpolated between reads) against the sum of the shards' energies (each an
aligned counter window); and the same less the agent's measured idle draw over the job's wall (marginal).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (3, 64, 64)


def build():  # noqa: ANN201  (torch is imported inside: this module also runs where only numpy is needed)
    return resnet18(lambda images: images.reshape(-1, *SHAPE).float() / 255.0)


def resnet18(scaled):  # noqa: ANN001, ANN201
    """The CNN, its input made (N, 3, H, W) float by `scaled` on the device."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.body(x) + self.skip(x))

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[nn.Module] = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True)]
            cin = 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.features = nn.Sequential(*layers)
            self.head = nn.Linear(512, 1000)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            x = scaled(images)
            return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    torch.manual_seed(0)
    return ResNet18().eval()


def make_data(folder: Path, rows: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "images.npy"
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(rows, *SHAPE))
    rng = np.random.default_rng(0)
    for start in range(0, rows, 65_536):
        stop = min(start + 65_536, rows)
        array[start:stop] = rng.integers(0, 256, (stop - start, *SHAPE), dtype=np.uint8)
    array.flush()
    return path


def raw_rate(path: Path, batch_size: int) -> dict[str, float]:
    import torch

    images = np.load(path, mmap_mode="r")
    model = build().to("cuda")
    with torch.inference_mode():
        for _ in range(3):  # warm-up: cuDNN's choices, the allocator
            model(torch.from_numpy(np.ascontiguousarray(images[:batch_size])).to("cuda"))
        torch.cuda.synchronize()
        began = time.perf_counter()
        for start in range(0, len(images), batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(images[start:start + batch_size])).to("cuda")
            model(batch).cpu()
        torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    return {"rows": len(images), "seconds": seconds, "rows_per_s": len(images) / seconds, "batch_size": batch_size}


class CounterSampler:
    """NVML's total-energy counter (mJ) with the wall time of each read, every 50 ms, in a thread."""

    def __init__(self, index: int = 0) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        self.reads: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CounterSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.nvml.nvmlShutdown()

    def _run(self) -> None:
        while True:
            self.reads.append((time.time(), int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))))
            if self._stop.wait(0.05):
                return

    def joules(self, t0: float, t1: float) -> float:
        times = [t for t, _ in self.reads]
        values = [v for _, v in self.reads]
        return float(np.interp(t1, times, values) - np.interp(t0, times, values)) / 1000.0


def run_job(folder: Path, raw: dict[str, float], batch_size: int) -> None:
    import yaml

    from farm.client import Client, find_head
    from farm.client.preflight import prepare

    spec = {"name": "resnet18-auto", "kind": "inference", "model": "benchmarks.gpu.auto_shards:build",
            "dataset": {"location": str(folder / "images.npy"), "format": "npy"}, "shards": "auto",
            "batch_size": batch_size, "backends": ["cuda"], "policy": "efficiency", "output": "/tmp/out/resnet18-auto"}
    path = Path("/tmp/resnet18-auto.yaml")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    prepared = prepare(path, ROOT)
    with CounterSampler() as counter, Client(find_head()) as client:
        began = time.time()
        job_id = client.submit_prepared(prepared)
        job = None
        for job in client.watch(job_id):
            pass
        ended = time.time()
        time.sleep(0.2)  # a read after the end
        node = next(n for n in client.nodes() if any(b.device == "cuda:0" for b in n.backends))
    assert job is not None
    if job.state != "succeeded":
        sys.exit(f"job {job_id} ended {job.state}: {job.error}")
    idle_w = next((b.idle_w for b in node.backends if b.device == "cuda:0" and b.idle_source), 0.0)
    wall = job.finished_at - job.started_at
    counted = counter.joules(job.started_at, job.finished_at)
    shards = sorted(job.shards, key=lambda s: s.start)
    summed = sum(s.energy_j for s in shards)
    marginal = sum(getattr(s, "marginal_j", 0.0) for s in shards)
    in_shards = sum(s.seconds for s in shards)
    print(f"job {job_id}: {job.items:,} rows, {len(shards)} shards, submit to end {ended - began:.2f} s, "
          f"head's job wall {wall:.2f} s, model time in shards {in_shards:.2f} s")
    print("shard sizes (rows, s): " + ", ".join(f"{s.stop - s.start:,} ({s.seconds:.2f})" for s in shards))
    print()
    print("| figure | value | against | ratio | goal |")
    print("|---|---:|---:|---:|---|")
    rate = job.items / (ended - began)
    print(f"| rows/s, submit to end | {rate:,.0f} | raw {raw['rows_per_s']:,.0f} | {rate / raw['rows_per_s']:.2f} | |")
    print(f"| rows/s, head's job wall | {job.items / wall:,.0f} | raw {raw['rows_per_s']:,.0f} | "
          f"{job.items / wall / raw['rows_per_s']:.2f} | |")
    print(f"| rows/s, inside the shards | {job.items / in_shards:,.0f} | raw {raw['rows_per_s']:,.0f} | "
          f"{job.items / in_shards / raw['rows_per_s']:.2f} | |")
    ok = abs(summed / counted - 1) <= 0.10 if counted else False
    print(f"| sum of shard energies, J (counter) | {summed:,.1f} | NVML over the job {counted:,.1f} | "
          f"{summed / counted if counted else 0:.3f} | within 10 %: {'met' if ok else 'not met'} |")
    over_idle = counted - idle_w * wall
    print(f"| sum of shard marginal energies, J | {marginal:,.1f} | NVML over the job less {idle_w:.0f} W idle x "
          f"{wall:.1f} s: {over_idle:,.1f} | {marginal / over_idle if over_idle > 0 else 0:.3f} | |")
    print(f"| rows/J (total; marginal) | {job.items / summed if summed else 0:,.1f}; "
          f"{job.items / marginal if marginal else 0:,.1f} | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("data", "raw", "job"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--raw", type=Path, help="raw rate JSON (job)")
    args = parser.parse_args()
    if args.what == "data":
        print(make_data(args.folder, args.rows))
    elif args.what == "raw":
        print(json.dumps(raw_rate(args.folder / "images.npy", args.batch_size)))
    else:
        run_job(args.folder, json.loads(args.raw.read_text()), args.batch_size)


if __name__ == "__main__":
    main()
