"""The read path alone, from files to batches on the device (issue 28, item 2): an image folder and a Parquet file,
each read four ways in one run, rows/s side by side.

    PYTHONPATH=.:agents python benchmarks/data_read.py [--images 4096] [--side 64] [--rows 262144] [--width 256]
        [--batch-size 256] [--workers N] [--data DIR] [--no-ray] [--repeat 2]

- a plain loop in one process: Pillow per file / pyarrow's iter_batches, np.stack, torch.from_numpy, .to(device);
- torch's DataLoader with `--workers` worker processes (pin_memory on CUDA), the same decode per item;
- Farm's node reader: the inference kind's own model_batches (farm.data.read, rebatch, the decode pool of
  farm.data.decoders, pinned staging) behind its prefetch thread, reading the files directly (a shared path), with
  `--workers` as the CPUs the node lends;
- Ray Data (when the venv has it): read_images / read_parquet, iter_batches, in a `ray.init(num_cpus=--workers)`.

Each batch goes to the device: CUDA when present (non_blocking from pinned memory where the way pins), else the CPU
(no copy), and the device is synchronised once at the end: the table is what a model downstream would wait on. The
files are written once into --data (default: a temporary folder) and read hot from the page cache. Each way runs
once untimed, then --repeat times, the best reported: a Farm worker starts its decoder processes once for all its
shards (and Ray's cluster starts before its rows), a DataLoader forks its workers at every pass. Reports the
machine (cores, GPU) with the table; the box should be quiet (`uptime`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]


def write_images(folder: Path, count: int, side: int) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    if len(list(folder.glob("*.png"))) != count:
        rng = np.random.default_rng(0)
        for i in range(count):  # smooth images, as photos compress: noise would make every PNG its raw size
            base = rng.integers(0, 255, (side // 8 + 1, side // 8 + 1, 3), dtype=np.uint8)
            pixels = np.kron(base, np.ones((8, 8, 1), np.uint8))[:side, :side]
            Image.fromarray(pixels).save(folder / f"{i:07d}.png")
    return folder


def write_parquet(path: Path, rows: int, width: int) -> Path:
    if not path.exists() or pq.ParquetFile(path).metadata.num_rows != rows:
        values = np.random.default_rng(0).standard_normal(rows * width, dtype=np.float32)
        column = pa.FixedSizeListArray.from_arrays(pa.array(values), width)
        pq.write_table(pa.table({"x": column}), path, row_group_size=65536)
    return path


def decode(path: str) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image)


def plain_images(folder: Path, batch: int, workers: int) -> Iterator[np.ndarray]:
    files = sorted(str(p) for p in folder.glob("*.png"))
    for start in range(0, len(files), batch):
        yield np.stack([decode(f) for f in files[start:start + batch]])


def plain_parquet(path: Path, batch: int, workers: int) -> Iterator[np.ndarray]:
    for found in pq.ParquetFile(path).iter_batches(batch_size=batch):
        column = found.column(0)
        yield column.flatten().to_numpy().reshape(len(column), -1)


def loader_images(folder: Path, batch: int, workers: int) -> Iterator[np.ndarray]:
    import torch
    from torch.utils.data import DataLoader, Dataset

    files = sorted(str(p) for p in folder.glob("*.png"))

    class Images(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int) -> np.ndarray:
            return decode(files[i])

    yield from DataLoader(Images(), batch_size=batch, num_workers=workers, pin_memory=torch.cuda.is_available(),
                          persistent_workers=False)


def loader_parquet(path: Path, batch: int, workers: int) -> Iterator[np.ndarray]:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    groups = pq.ParquetFile(path).num_row_groups

    class Groups(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Iterator[np.ndarray]:
            info = get_worker_info()
            mine = range(groups) if info is None else range(info.id, groups, info.num_workers)
            for found in pq.ParquetFile(path).iter_batches(batch_size=batch, row_groups=list(mine)):
                column = found.column(0)
                yield column.flatten().to_numpy().reshape(len(column), -1)

    yield from DataLoader(Groups(), batch_size=None, num_workers=workers, pin_memory=torch.cuda.is_available())


def farm_reader(location: Path, fmt: str, batch: int, workers: int, device: str) -> Iterator[np.ndarray]:
    from farm import data
    from farm.core.dataset import DatasetSpec
    from farm.core.tasks import DataTask, ShardTask
    from farm_agent.work.kinds.inference import model_batches
    from farm_agent.work.prefetch import prefetch

    spec = DatasetSpec(location=str(location), format=fmt, shared=True)
    plan = data.plan(spec)
    task = ShardTask(job_id="bench", index=0, start=0, stop=plan.size, model="m:f", weights=None, dataset="",
                     batch_size=batch, backend="cuda" if device.startswith("cuda") else "cpu", device=device,
                     threads=workers, data=DataTask(spec=spec, plan=plan))
    for found in prefetch(model_batches(task, Path.cwd())):
        yield found.inputs


def ray_images(folder: Path, batch: int, workers: int) -> Iterator[np.ndarray]:
    import ray

    for found in ray.data.read_images(str(folder)).iter_batches(batch_size=batch, batch_format="numpy"):
        yield found["image"]


def ray_parquet(path: Path, batch: int, workers: int) -> Iterator[np.ndarray]:
    import ray

    for found in ray.data.read_parquet(str(path)).iter_batches(batch_size=batch, batch_format="numpy"):
        yield found["x"]


def consume(batches: Iterator[np.ndarray], device: str) -> int:
    """Each batch onto the device, as a model's input; the rows."""
    import torch

    rows = 0
    target = torch.device(device)
    for found in batches:
        if isinstance(found, np.ndarray) and found.dtype == object:  # arrays per row (a way that does not stack)
            found = np.stack(list(found))
        tensor = found if isinstance(found, torch.Tensor) else torch.as_tensor(found)
        on = tensor.to(target, non_blocking=tensor.is_pinned()) if device != "cpu" else tensor
        rows += len(on)
    if device.startswith("cuda"):
        torch.cuda.synchronize(target)
    return rows


def timed(run: Callable[[], Iterator[np.ndarray]], device: str) -> tuple[int, float, float]:
    """Rows, seconds, and the CPU seconds of this process (the thread feeding the device and what reads and decodes
    in-process; not a way's worker processes): the serial part, which no added core speeds up."""
    began, used = time.perf_counter(), time.process_time()
    rows = consume(run(), device)
    return rows, time.perf_counter() - began, time.process_time() - used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--side", type=int, default=64, help="pixels a side of each RGB PNG")
    parser.add_argument("--rows", type=int, default=262_144, help="rows of the Parquet file")
    parser.add_argument("--width", type=int, default=256, help="float32 values a row")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="CPUs lent to reading")
    parser.add_argument("--data", type=Path, default=None, help="where the files are written (kept)")
    parser.add_argument("--no-ray", action="store_true", help="leave Ray Data out")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs a way (the best is reported)")
    args = parser.parse_args()
    import torch

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    folder = args.data or Path(tempfile.mkdtemp(prefix="farm-data-read-"))
    images = write_images(folder / f"images-{args.images}-{args.side}", args.images, args.side)
    table = write_parquet(folder / f"rows-{args.rows}-{args.width}.parquet", args.rows, args.width)
    ray_ok = not args.no_ray and importlib.util.find_spec("ray.data") is not None
    b, w = args.batch_size, args.workers
    ways: list[tuple[str, str, Callable[[], Iterator[np.ndarray]]]] = [
        ("image folder", "plain loop, one process", lambda: plain_images(images, b, w)),
        ("image folder", f"DataLoader, {w} workers", lambda: loader_images(images, b, w)),
        ("image folder", f"Farm node reader, {w} CPUs", lambda: farm_reader(images, "images", b, w, device)),
        ("parquet", "plain loop, one process", lambda: plain_parquet(table, b, w)),
        ("parquet", f"DataLoader, {w} workers", lambda: loader_parquet(table, b, w)),
        ("parquet", f"Farm node reader, {w} CPUs", lambda: farm_reader(table, "parquet", b, w, device)),
    ]
    if ray_ok:  # last, its cluster started just before (not timed) so that its daemons idle in no other row
        ways.append(("image folder", f"Ray Data, {w} CPUs", lambda: ray_images(images, b, w)))
        ways.append(("parquet", f"Ray Data, {w} CPUs", lambda: ray_parquet(table, b, w)))
    gpu = torch.cuda.get_device_name(0) if device != "cpu" else "no GPU"
    out = Table(title=f"Reading to {device} ({gpu}; {os.cpu_count()} cores, {platform.machine()}; batch {b}; "
                      f"{args.images:,} PNGs of {args.side}x{args.side}, Parquet {args.rows:,} x {args.width} "
                      "float32)", title_justify="left")
    for column in ("data", "way", "rows", "seconds", "rows/s", "x plain loop", "CPU s in this process"):
        out.add_column(column, justify="left" if column in ("data", "way") else "right")
    plain: dict[str, float] = {}
    rows: dict[str, list[list[str]]] = {}
    for kind, way, run in ways:
        if way.startswith("Ray Data"):
            import ray

            if not ray.is_initialized():
                ray.init(num_cpus=w, include_dashboard=False, log_to_driver=False)
        timed(run, device)  # untimed: what a worker starts once (Farm's decoder processes, Ray's actors)
        run_rows, seconds, cpu = min((timed(run, device) for _ in range(args.repeat)), key=lambda found: found[1])
        rate = run_rows / seconds
        plain.setdefault(kind, rate)
        rows.setdefault(kind, []).append([kind, way, f"{run_rows:,}", f"{seconds:.2f}", f"{rate:,.0f}",
                                          f"{rate / plain[kind]:.2f}", f"{cpu:.2f}"])
        print(" | ".join(rows[kind][-1]), file=sys.stderr, flush=True)
    for row in (r for found in rows.values() for r in found):
        out.add_row(*row)
    if ray_ok:
        import ray

        ray.shutdown()
    Console(width=160).print(out)


if __name__ == "__main__":
    main()
