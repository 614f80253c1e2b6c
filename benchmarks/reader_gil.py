"""How much a node's reader thread slows the model's thread in the same worker process through the GIL: a GPU-like
model step (--ops small torch ops, each of which releases the GIL and takes it back, as a kernel launch does, then
--device-ms of waiting for the device with the GIL released) timed alone, then beside Farm's reader over an image
folder in a thread (farm.data.read and the batches' rebatching; with --decode, the images decoded on Farm's decoder
processes too, as a shard's reader does), at each GIL switch interval of --switch-ms.

    PYTHONPATH=.:agents python benchmarks/reader_gil.py [--images 8192] [--ops 100] [--device-ms 10]
        [--switch-ms 5 1 0.5] [--decode]

On the 2-core dev box (2026-12-05, 8,192 PNGs of 64x64; two runs of each), a step of 100 ops and 10 ms took
10.4 ms alone, and on average 12.2 ms beside the reader reading (+17 % at 5 and 1 ms, +10 % at 0.5 ms) and 11.3-12.1
ms beside it reading and decoding at ~18,000 files/s (+8-16 %), the switch interval making no steady difference: the
reader releases the GIL at each file it opens and reads, and the model's thread waits at its ops' hand-backs, not
for an interval to expire. A shard's reader shares its worker's GIL with the model (farm_agent.work.prefetch); a
DataLoader's workers are processes of their own.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=8192)
    parser.add_argument("--ops", type=int, default=100, help="small torch ops a model step launches")
    parser.add_argument("--device-ms", type=float, default=10.0, help="a step's wait for the device, GIL released")
    parser.add_argument("--switch-ms", type=float, nargs="+", default=[5.0, 1.0, 0.5])
    parser.add_argument("--decode", action="store_true", help="the reader decodes too (Farm's decoder processes)")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()

    import torch

    from data_read import write_images  # benchmarks/ is the script's path
    from farm.core.dataset import DataFormat, DatasetSpec
    from farm.data import decoders, plan, read
    from farm.data.batches import numpy_batches, rebatch

    torch.set_num_threads(1)
    folder = write_images(Path("/tmp") / f"farm-reader-gil-{args.images}", args.images, 64)
    planned = plan(DatasetSpec(location=str(folder), format="images"))
    decoders.start_server()
    x = torch.zeros(4)

    def step() -> None:
        for _ in range(args.ops):
            x.add_(1)
        time.sleep(args.device_ms / 1000)

    def timed() -> float:  # the mean: a job's rate is its steps' total time, slow ones included
        began = time.perf_counter()
        for _ in range(args.steps):
            step()
        return (time.perf_counter() - began) / args.steps * 1000

    def reader(stop: threading.Event, count: list[int]) -> None:
        while not stop.is_set():
            batches = rebatch(read(planned, 0, planned.size, ["image", "path"], 256, workers=2), 256)
            if args.decode:
                for _, arrays in numpy_batches(batches, ["image"], DataFormat.IMAGES, planned.location, 2, 3):
                    count[0] += len(arrays["image"])
                    if stop.is_set():
                        return
                continue
            for batch in batches:
                batch.column("image").to_pylist()  # the bytes as the decoders take them
                count[0] += batch.num_rows
                if stop.is_set():
                    return

    table = Table(title=f"A model step ({args.ops} ops, {args.device_ms:g} ms on the device) beside the node's reader "
                        f"({'reading and decoding' if args.decode else 'reading'} {args.images:,} PNGs), median of "
                        f"{args.steps}", title_justify="left")
    for column in ("GIL switch interval", "step alone ms", "beside the reader ms", "slower by", "reader files/s"):
        table.add_column(column, justify="right")
    for switch in args.switch_ms:
        sys.setswitchinterval(switch / 1000)
        timed()  # untimed: the first steps
        alone = timed()
        stop, count = threading.Event(), [0]
        thread = threading.Thread(target=reader, args=(stop, count), daemon=True)
        thread.start()
        time.sleep(0.5)
        began, before = time.perf_counter(), count[0]
        beside = timed()
        rate = (count[0] - before) / (time.perf_counter() - began)
        stop.set()
        thread.join()
        table.add_row(f"{switch:g} ms", f"{alone:.2f}", f"{beside:.2f}", f"{100 * (beside / alone - 1):+.0f} %",
                      f"{rate:,.0f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
