"""Issue 28's benchmark on the lent GPU machine: three job shapes, each run by four ways on the same machine, in one
call (benchmarks/gpu/data_jobs_h200.sh), with the GPU's energy and utilisation through each.

    python benchmarks/gpu/data_jobs.py data DIR [--scale 1]                  # the three datasets (seeded)
    python benchmarks/gpu/data_jobs.py idle DIR                              # the GPU's idle W, before Farm is up
    python benchmarks/gpu/data_jobs.py run DIR --ways plain loader ray       # the ways without Farm, before it is up
    python benchmarks/gpu/data_jobs.py run DIR --ways farm                   # a head and a cuda agent up (farm_up)
    python benchmarks/gpu/data_jobs.py table DIR                             # the tables and the issue's goals

The shapes (`--shapes`, default all three), made here with seeded values:
- parquet: 1,048,576 rows x 256 float32 (`x`, fixed-size lists; one file, 64 Ki-row groups) through a
  compute-light MLP (256 -> 512 -> 512 -> 16);
- images: 65,536 RGB 64x64 PNGs in a folder through a ResNet-18-shaped CNN (uint8 HWC, scaled on the device);
- npy: 131,072 images 3x64x64 float32 in one .npy (6.4 GB) through the same CNN.
`--scale` shrinks every count (a CPU dry run: `--scale 0.01 --device cpu`).

The ways, each reading the data, running the model on the device and writing its outputs as Parquet:
- plain: one process, batch by batch (pyarrow's iter_batches; Pillow per file; the .npy memory-mapped);
- loader: torch's DataLoader with --workers processes and pinned memory (by row group, by file, by batch);
- ray: Ray Data (read_parquet / read_images / read_numpy -> map_batches with one GPU actor -> write_parquet), in a
  ray.init(num_cpus=--workers) started before its window;
- farm: a Farm job through the head on this machine and its one `cuda` agent (`shards: auto`), submitted from here;
  its wall is the head's (first shard's start to its end), with submit-to-end beside it. The node reads through
  the head's data service (`shared: false`); farm-shared: the same job with `shared: true`, as Farm runs it by
  default (the node reads the path itself, seeing its files there as the head planned them).

Each row: wall seconds, rows/s, NVML's energy counter over the window (read every 50 ms in a thread, interpolated),
the same less the GPU's idle draw (measured first, 5 s with nothing running), joules above idle per row, and the
GPU's utilisation sampled over the window (NVML, every 50 ms). Without NVML (a CPU dry run) the energy is "-".
Rows go to DIR/results.jsonl, one a way and shape; `table` prints them with the goals: Farm's wall >= 0.9x the
faster of plain and loader; Farm's rows/s >= 2x Ray Data's; Farm's joules above idle a row <= 1.1x the faster
loop's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents"), str(ROOT / "benchmarks")]

SHAPES = ("parquet", "images", "npy")
WAYS = ("plain", "loader", "ray", "farm", "farm-shared")
ROWS = {"parquet": 1_048_576, "images": 65_536, "npy": 131_072}
BATCH = {"parquet": 4096, "images": 256, "npy": 512}
WIDTH, SIDE = 256, 64


# ---- the models (the Farm job names them: benchmarks.gpu.data_jobs:mlp / :cnn_hwc / :cnn_chw)

def mlp():  # noqa: ANN201
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 16)).eval()


def cnn_hwc():  # noqa: ANN201
    """The ResNet-18-shaped CNN of benchmarks/gpu/auto_shards.py over decoded images: uint8 (N, H, W, 3), scaled on
    the device."""
    from benchmarks.gpu.auto_shards import resnet18

    return resnet18(lambda x: x.permute(0, 3, 1, 2).float() / 255.0)


def cnn_chw():  # noqa: ANN201
    """The same CNN over float32 (N, 3, H, W)."""
    from benchmarks.gpu.auto_shards import resnet18

    return resnet18(lambda x: x)


MODEL = {"parquet": "mlp", "images": "cnn_hwc", "npy": "cnn_chw"}


# ---- the data

def paths(folder: Path) -> dict[str, Path]:
    return {"parquet": folder / "rows.parquet", "images": folder / "images", "npy": folder / "images.npy"}


def make_data(folder: Path, scale: float, shapes: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data_read import write_images

    folder.mkdir(parents=True, exist_ok=True)
    where, rows = paths(folder), {s: max(int(ROWS[s] * scale), BATCH[s]) for s in SHAPES}
    (folder / "rows.json").write_text(json.dumps(rows))
    if "parquet" in shapes:
        rng = np.random.default_rng(0)
        with pq.ParquetWriter(where["parquet"], pa.schema([("x", pa.list_(pa.float32(), WIDTH))])) as writer:
            for start in range(0, rows["parquet"], 65_536):
                count = min(65_536, rows["parquet"] - start)
                values = pa.array(rng.standard_normal(count * WIDTH, dtype=np.float32))
                writer.write_table(pa.table({"x": pa.FixedSizeListArray.from_arrays(values, WIDTH)}))
    if "images" in shapes:
        write_images(where["images"], rows["images"], SIDE)
    if "npy" in shapes:
        array = np.lib.format.open_memmap(where["npy"], mode="w+", dtype=np.float32,
                                          shape=(rows["npy"], 3, SIDE, SIDE))
        rng = np.random.default_rng(0)
        for start in range(0, rows["npy"], 8192):
            stop = min(start + 8192, rows["npy"])
            array[start:stop] = rng.random((stop - start, 3, SIDE, SIDE), dtype=np.float32)
        array.flush()
        del array
    print(json.dumps(rows))


# ---- the GPU's counters

class Meter:
    """NVML's energy counter and utilisation, read every 50 ms in a thread; absent without NVML (CPU)."""

    def __init__(self, device: str) -> None:
        self.nvml: Any = None
        self.reads: list[tuple[float, int, int]] = []  # (time, mJ, utilisation %)
        if device.startswith("cuda"):
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(device.partition(":")[2] or 0))
            except Exception as exc:  # noqa: BLE001 - the table then says "-"
                print(f"no NVML: {exc}", file=sys.stderr)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if self.nvml is not None:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            energy = int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
            busy = int(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            self.reads.append((time.time(), energy, busy))

    def joules(self, t0: float, t1: float) -> float | None:
        if len(self.reads) < 2:
            return None
        times, values = [r[0] for r in self.reads], [r[1] for r in self.reads]
        return float(np.interp(t1, times, values) - np.interp(t0, times, values)) / 1000.0

    def utilisation(self, t0: float, t1: float) -> float | None:
        inside = [r[2] for r in self.reads if t0 <= r[0] <= t1]
        return float(np.mean(inside)) if inside else None

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


# ---- the ways: each returns (rows, its window's start and end)

class Writer:
    """The outputs of a way, one Parquet file at the end: row ids and the model's output vectors."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []

    def add(self, outputs: Any) -> None:
        self.parts.append(outputs.float().cpu().numpy())

    def write(self, path: Path) -> int:
        import pyarrow as pa
        import pyarrow.parquet as pq

        outputs = np.concatenate(self.parts) if self.parts else np.zeros((0, 1), np.float32)
        column = pa.FixedSizeListArray.from_arrays(pa.array(outputs.reshape(-1)), outputs.shape[1])
        pq.write_table(pa.table({"row_id": pa.array(np.arange(len(outputs))), "output": column}), path)
        return len(outputs)


def _infer(model: Any, batches: Iterator[Any], device: str, out: Path) -> int:
    import torch

    writer = Writer()
    with torch.inference_mode():
        for batch in batches:
            tensor = batch if isinstance(batch, torch.Tensor) else torch.as_tensor(np.ascontiguousarray(batch))
            writer.add(model(tensor.to(device, non_blocking=tensor.is_pinned())))
    return writer.write(out)


def plain(shape: str, data: Path, device: str, workers: int, out: Path) -> int:
    from data_read import plain_images, plain_parquet

    model, batch = globals()[MODEL[shape]]().to(device), BATCH[shape]
    if shape == "npy":
        rows = np.load(data, mmap_mode="r")
        batches: Iterator[Any] = (rows[s:s + batch] for s in range(0, len(rows), batch))
    else:
        batches = (plain_parquet if shape == "parquet" else plain_images)(data, batch, workers)
    return _infer(model, batches, device, out)


def loader(shape: str, data: Path, device: str, workers: int, out: Path) -> int:
    from torch.utils.data import DataLoader, Dataset

    from data_read import loader_images, loader_parquet

    model, batch = globals()[MODEL[shape]]().to(device), BATCH[shape]
    if shape != "npy":
        return _infer(model, (loader_parquet if shape == "parquet" else loader_images)(data, batch, workers), device,
                      out)
    count = len(np.load(data, mmap_mode="r"))

    class Slices(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return -(-count // batch)

        def __getitem__(self, i: int) -> np.ndarray:
            return np.ascontiguousarray(np.load(data, mmap_mode="r")[i * batch:(i + 1) * batch])

    found = DataLoader(Slices(), batch_size=None, num_workers=workers, pin_memory=device.startswith("cuda"))
    return _infer(model, iter(found), device, out)


def ray_data(shape: str, data: Path, device: str, workers: int, out: Path) -> int:
    import ray

    read = {"parquet": ray.data.read_parquet, "images": ray.data.read_images, "npy": ray.data.read_numpy}[shape]
    column = {"parquet": "x", "images": "image", "npy": "data"}[shape]
    build = globals()[MODEL[shape]]  # the function itself goes to the actor (by value: this may be __main__)

    class Infer:
        def __init__(self) -> None:
            self.model = build().to(device)

        def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            import torch

            x = batch[column]
            if x.dtype == object:  # lists a row (Parquet's fixed-size lists)
                x = np.stack(list(x))
            with torch.inference_mode():
                return {"output": self.model(torch.as_tensor(x).to(device)).float().cpu().numpy()}

    gpus = 1 if device.startswith("cuda") else 0
    done = (read(str(data)).map_batches(Infer, batch_size=BATCH[shape], concurrency=1, num_gpus=gpus,
                                        batch_format="numpy"))
    done.write_parquet(str(out))
    import pyarrow.dataset

    return pyarrow.dataset.dataset(str(out)).count_rows()  # what it wrote (count() would run it all again)


def farm(shape: str, data: Path, device: str, workers: int, out: Path, shared: bool = False
         ) -> tuple[int, float, float, float, str]:
    """The job through the head running on this machine: (rows, the head's job start and end, submit-to-end, its
    id). The node reads the dataset through the head's data service; `shared` (the way farm-shared): from the path
    itself, as a node that mounts it at the same place does (`shared: true`)."""
    import yaml

    from farm.client import Client, find_head
    from farm.client.preflight import prepare

    fmt = {"parquet": "parquet", "images": "images", "npy": "npy"}[shape]
    backend = "cuda" if device.startswith("cuda") else "cpu"
    spec = {"name": f"data-{shape}", "kind": "inference", "model": f"benchmarks.gpu.data_jobs:{MODEL[shape]}",
            "dataset": {"location": str(data), "format": fmt, "shared": shared}, "shards": "auto",
            "batch_size": BATCH[shape], "backends": [backend], "output": str(out)}
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    prepared = prepare(path, job_folder())
    with Client(find_head()) as client:
        began = time.time()
        job_id = client.submit_prepared(prepared, overwrite=True)
        job = None
        for job in client.watch(job_id):
            pass
        ended = time.time()
    if job is None or job.state != "succeeded":
        sys.exit(f"job {job_id} ended {job.state if job else '?'}: {job.error if job else ''}")
    return job.items, job.started_at, job.finished_at, ended - began, job_id


def job_folder() -> Path:
    """The job's code as a user's folder would hold it: the models' two modules, not all of this repository (whose
    823 files the agent unpacked for the job's worker, 0.1-0.15 s on the dev box, before its first shard)."""
    import shutil
    import tempfile

    folder = Path(tempfile.gettempdir()) / "farm-data-jobs-code"
    for name in ("data_jobs.py", "auto_shards.py"):
        target = folder / "benchmarks" / "gpu" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / "benchmarks" / "gpu" / name, target)
    return folder


def warm(shapes: list[str], device: str, how: str = "device") -> None:
    """This process's GPU made ready before any window, as Farm's agent makes its warm worker's (`device`, the
    default: farm_agent.backends.cuda.warm, CUDA's context and cuBLAS's and cuDNN's handles), so that the loops and
    Farm's job start equal: each then pays its own model's first batch (cuDNN's choice of algorithms for its shapes,
    its kernels' first load) inside its window, as a user's loop does. `model`: one batch of each shape's model run
    too (the figures before 2026-12-06 were measured so), which takes that first batch out of the loops' windows but
    not out of Farm's. Ray's actor starts its own context inside its window either way."""
    from farm_agent.backends import cuda

    cuda.warm(device)
    if how != "model":
        return
    import torch

    sample = {"parquet": torch.zeros(BATCH["parquet"], WIDTH),
              "images": torch.zeros(BATCH["images"], SIDE, SIDE, 3, dtype=torch.uint8),
              "npy": torch.zeros(BATCH["npy"], 3, SIDE, SIDE)}
    with torch.inference_mode():
        for shape in shapes:
            globals()[MODEL[shape]]().to(device)(sample[shape].to(device)).float().cpu()


RUN: dict[str, Callable[..., Any]] = {"plain": plain, "loader": loader, "ray": ray_data, "farm": farm,
                                     "farm-shared": lambda *args: farm(*args, shared=True)}


def idle_draw(meter: Meter) -> float | None:
    """The GPU's idle draw (W) over 5 s, with nothing of ours on it; None without NVML."""
    if meter.nvml is None:
        return None
    began = time.time()
    time.sleep(5.0)
    joules = meter.joules(began, time.time())
    return joules / (time.time() - began) if joules is not None else None


def run(folder: Path, shapes: list[str], ways: list[str], device: str, workers: int, idle_w: float | None = None,
        warm_how: str = "device") -> None:
    """`idle_w`: the idle draw measured before anything of Farm's started (`idle`), since a Farm agent keeps a
    warm worker's CUDA context on the GPU; else measured here first. `warm_how`: warm()'s."""
    meter = Meter(device)
    if idle_w is None:
        idle_w = idle_draw(meter)
    if "ray" in ways:
        import ray

        # Its workers import the models' module from this tree (they inherit this environment, not sys.path)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
        ray.init(num_cpus=workers, num_gpus=1 if device.startswith("cuda") else 0, include_dashboard=False,
                 log_to_driver=False)
    where = paths(folder)
    if device.startswith("cuda") and {"plain", "loader"} & set(ways):  # the ways that use this process's GPU
        warm(shapes, device, warm_how)
    try:
        for shape in shapes:
            for way in ways:
                out = folder / "out" / f"{way}-{shape}"
                out.parent.mkdir(parents=True, exist_ok=True)
                began = time.time()
                found = RUN[way](shape, where[shape], device, workers, out)
                ended = time.time()
                submit_to_end = job_id = None
                if way.startswith("farm"):
                    found, began, ended, submit_to_end, job_id = found
                joules = meter.joules(began, ended)
                wall = ended - began
                row = {"shape": shape, "way": way, "rows": int(found), "wall_s": wall, "rows_per_s": found / wall,
                       "submit_to_end_s": submit_to_end, "joules": joules, "idle_w": idle_w,
                       "above_idle_j": joules - idle_w * wall if joules is not None and idle_w is not None else None,
                       "utilisation": meter.utilisation(began, ended), "device": device, "workers": workers,
                       "job": job_id}
                print(json.dumps(row), flush=True)
                with open(folder / "results.jsonl", "a") as results:
                    results.write(json.dumps(row) + "\n")
    finally:
        meter.close()
        if "ray" in ways:
            import ray

            ray.shutdown()


def table(folder: Path) -> None:
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    last = {(r["shape"], r["way"]): r for r in rows}  # the latest run of each
    for shape in SHAPES:
        mine = {way: last[(shape, way)] for way in WAYS if (shape, way) in last}
        if not mine:
            continue
        print(f"\n{shape}: {next(iter(mine.values()))['rows']:,} rows\n")
        print("| way | wall s | submit to end s | rows/s | J (NVML) | J above idle | J above idle / row | GPU util % |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for way, r in mine.items():
            per_row = r["above_idle_j"] / r["rows"] if r["above_idle_j"] is not None else None
            print(f"| {way} | {r['wall_s']:.2f} | {_f(r['submit_to_end_s'], '.2f')} | {r['rows_per_s']:,.0f} | "
                  f"{_f(r['joules'], ',.0f')} | {_f(r['above_idle_j'], ',.0f')} | {_f(per_row, '.4f')} | "
                  f"{_f(r['utilisation'], '.0f')} |")
        for name in ("farm", "farm-shared"):
            if name in mine:
                _goals(name, mine)


def _goals(name: str, mine: dict[str, dict[str, Any]]) -> None:
    f = mine[name]
    loops = [mine[w] for w in ("plain", "loader") if w in mine]
    if loops:
        faster = min(loops, key=lambda r: r["wall_s"])
        ratio = faster["wall_s"] / f["wall_s"]
        print(f"\n- {name}'s wall against the faster loop ({faster['way']}): {ratio:.2f}x (goal >= 0.9: "
              f"{'met' if ratio >= 0.9 else 'not met'})")
        if f["above_idle_j"] is not None and faster["above_idle_j"]:
            joules = (f["above_idle_j"] / f["rows"]) / (faster["above_idle_j"] / faster["rows"])
            print(f"- {name}'s joules above idle a row against {faster['way']}'s: {joules:.2f}x (goal <= 1.1: "
                  f"{'met' if joules <= 1.1 else 'not met'})")
    if "ray" in mine:
        ratio = f["rows_per_s"] / mine["ray"]["rows_per_s"]
        print(f"- {name}'s rows/s against Ray Data's: {ratio:.2f}x (goal >= 2: {'met' if ratio >= 2 else 'not met'})")


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("data", "idle", "run", "table"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=["plain", "loader", "ray"])
    parser.add_argument("--scale", type=float, default=1.0, help="the datasets' sizes, as a share of the full ones")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                        help="CPUs the loops lend to reading (the DataLoader's workers, Ray's CPUs): the agent's")
    parser.add_argument("--idle-w", type=float, default=None,
                        help="the GPU's idle draw as `idle` printed it (default: measured at the run's start)")
    parser.add_argument("--warm", choices=("device", "model"), default="device",
                        help="what the loops' process runs before their windows (warm()): the device's set-up as "
                             "Farm's warm worker makes it, or that and each shape's model once")
    args = parser.parse_args()
    if args.what == "data":
        make_data(args.folder, args.scale, args.shapes)
    elif args.what == "idle":
        meter = Meter(args.device)
        try:
            print(f"{idle_draw(meter) or 0.0:.3f}")
        finally:
            meter.close()
    elif args.what == "run":
        run(args.folder, args.shapes, args.ways, args.device, args.workers, args.idle_w, args.warm)
    else:
        table(args.folder)


if __name__ == "__main__":
    main()
