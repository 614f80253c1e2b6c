"""Issue 29 on the lent GPU machine: the same inference job twice through a real head and one `cuda` agent, untuned
then with `tune_budget_s`, over a compute-bound model with its data already on the node; a table of in-shard rows/s,
items per joule above idle, the tuning's seconds and joules and the in-job A/B's verdict (farm.head.tuning). Run by
benchmarks/gpu/tuned_job_h200.sh (a head and a cuda agent up, FARM_STATE_DIR set).

    python benchmarks/gpu/tuned_job.py data DIR [--rows 262144]
    python benchmarks/gpu/tuned_job.py jobs DIR [--batch-size 512] [--budget 120] [--shards 16] [--model resnet18]

The data: 3x64x64 uint8 images in one .npy on the node's disk (read through the page cache after the first job:
compute-bound, not read-bound). The model (--model): `resnet18`, benchmarks/gpu/auto_shards.py's ResNet-18-shaped CNN,
on which no candidate beat PyTorch's defaults in the whole-model suite (docs/h100-2026-12-06.md); or `convnext`,
ConvNeXt-style blocks (convnext() below), whose like in that suite compile-default ran 1.38-1.40x faster and cheaper
than the defaults: a model the tuner can win on. The job's shards are
fixed (--shards), so that the A/B has shards on both sides: the first ones run eager, the next ones the winner.
Goals (issue 29): in-shard rows/s >= 1.2x and items/J above idle >= 1.15x, tuned against untuned; where no candidate
wins, the tuned job is no worse in items/J than the tuning's own cost, which the job's tuning lines state.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu.auto_shards import make_data  # noqa: E402


MODELS = {"resnet18": "benchmarks.gpu.auto_shards:build", "convnext": "benchmarks.gpu.tuned_job:convnext"}


def convnext():  # noqa: ANN201  (torch is imported inside: the `data` step needs numpy only)
    """ConvNeXt-style blocks (7x7 depthwise, LayerNorm over channels, inverted MLP: the whole-model suite's
    convnext_blocks) after a 1x1 stem, 96 channels at the images' full 64x64, on the job's uint8 images scaled on the
    device. (With a 2x2 stem, at 32x32, an H100 ran it untuned at 15.6 k rows/s: a job of 262,144 rows was too short
    for tuning to pay, and the head did not tune; at 64x64 each row costs about 4x that.)"""
    import torch
    from torch import nn

    from benchmarks.gpu.auto_shards import SHAPE

    class Block(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.depthwise = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
            self.norm = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.mlp(self.norm(self.depthwise(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)

    class ConvNeXt(nn.Module):
        def __init__(self, dim: int = 96, depth: int = 4) -> None:
            super().__init__()
            self.stem = nn.Conv2d(SHAPE[0], dim, 1)
            self.blocks = nn.Sequential(*(Block(dim) for _ in range(depth)))
            self.head = nn.Linear(dim, 1000)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            x = self.blocks(self.stem(images.reshape(-1, *SHAPE).float() / 255.0))
            return self.head(x.mean(dim=(2, 3)))

    torch.manual_seed(0)
    return ConvNeXt().eval()


def run(folder: Path, batch_size: int, shards: int, budget: float | None, model: str = "resnet18",
        rtol: float | None = None) -> tuple[Any, list[str]]:
    import yaml

    from farm.client import Client, find_head
    from farm.client.preflight import prepare

    name = f"{model}-tuned" if budget else f"{model}-untuned"
    spec: dict[str, Any] = {
        "name": name, "kind": "inference", "model": MODELS[model],
        "dataset": {"location": str(folder / "images.npy"), "format": "npy"}, "shards": shards,
        "batch_size": batch_size, "backends": ["cuda"], "policy": "efficiency",
        "output": f"/tmp/out/{name}-{int(time.time())}"}
    if budget:
        spec["tune_budget_s"] = budget
    if rtol is not None:  # what the job's outputs may differ from strict fp32 by: 1e-3 lets TF32 products in
        spec["tolerance"] = {"atol": rtol, "rtol": rtol}
    path = Path(f"/tmp/{name}.yaml")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    with Client(find_head()) as client:
        job_id = client.submit_prepared(prepare(path, ROOT))
        for _ in client.watch(job_id):
            pass
        time.sleep(0.2)
        job = client.job(job_id)
        lines = [line.message for line in client.logs(job_id) if line.message.startswith("tuning: ")]
    if job.state != "succeeded":
        sys.exit(f"job {job_id} ended {job.state}: {job.error}")
    return job, lines


def side(shards: list[Any]) -> tuple[int, float, float]:
    return (sum(s.items for s in shards), sum(s.seconds for s in shards), sum(s.marginal_j for s in shards))


def rates(items: int, seconds: float, joules: float) -> str:
    return f"{items / seconds if seconds else 0:,.0f} | {items / joules if joules else 0:,.2f}"


def jobs(folder: Path, batch_size: int, shards: int, budget: float, model: str = "resnet18",
         rtol: float | None = None, which: str = "both") -> None:
    untuned, _ = run(folder, batch_size, shards, None, model, rtol) if which != "tuned" else (None, [])
    tuned, lines = run(folder, batch_size, shards, budget, model, rtol) if which != "untuned" else (None, [])
    if untuned is None or tuned is None:  # one side only (a call too short for both): its figures, for a later table
        job = untuned or tuned
        print(f"{'untuned' if untuned else 'tuned'} job {job.id}: {model}, {job.items:,} rows, in-shard "
              f"rows/s | items/J above idle {rates(*side(list(job.shards)))}, job wall "
              f"{job.finished_at - job.started_at:.1f} s")
        for line in lines:
            print(f"  {line}")
        return
    spent = [re.search(r"the tuning took ([\d.]+) s(?: and ([\d,]+) J)?", line) for line in lines]
    tuning_s = sum(float(m.group(1)) for m in spent if m)
    tuning_j = sum(float(m.group(2).replace(",", "")) for m in spent if m and m.group(2))
    verdict = next((line.split(": ", 2)[-1] for line in lines if " kept: " in line or " reverted: " in line),
                   "no verdict (too few items on a side, or no winner)")
    base = side(list(untuned.shards))
    print(f"untuned job {untuned.id}, tuned job {tuned.id}: {model}, {tuned.items:,} rows, {shards} shards, "
          f"batch {batch_size}")
    print()
    print("| job | in-shard rows/s | items/J above idle | job wall s | tuning s | tuning J |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| untuned | {rates(*base)} | {untuned.finished_at - untuned.started_at:.1f} | - | - |")
    print(f"| tuned (all shards) | {rates(*side(list(tuned.shards)))} | "
          f"{tuned.finished_at - tuned.started_at:.1f} | {tuning_s:.1f} | {tuning_j:,.0f} |")
    eager = side([s for s in tuned.shards if not s.forward])
    winner = side([s for s in tuned.shards if s.forward])
    names = sorted({s.forward for s in tuned.shards if s.forward})
    print(f"| tuned: its eager shards | {rates(*eager)} | | | |")
    print(f"| tuned: its winner's shards ({', '.join(names) or 'none'}) | {rates(*winner)} | | | |")
    all_tuned = side(list(tuned.shards))
    speed = (all_tuned[0] / all_tuned[1]) / (base[0] / base[1]) if base[1] and all_tuned[1] else 0.0
    per_j = (all_tuned[0] / all_tuned[2]) / (base[0] / base[2]) if base[2] and all_tuned[2] else 0.0
    print()
    print(f"tuned against untuned: in-shard rows/s {speed:.2f}x (goal >= 1.2x), items/J above idle {per_j:.2f}x "
          f"(goal >= 1.15x)")
    print(f"A/B verdict: {verdict}")
    print("tuning lines (farm job --explain):")
    for line in lines:
        print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("data", "jobs"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rows", type=int, default=262_144)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--rtol", type=float, default=None, help="the job's tolerance (atol and rtol; default strict)")
    parser.add_argument("--which", choices=("both", "untuned", "tuned"), default="both")
    args = parser.parse_args()
    if args.what == "data":
        print(make_data(args.folder, args.rows))
    else:
        jobs(args.folder, args.batch_size, args.shards, args.budget, args.model, args.rtol, args.which)


if __name__ == "__main__":
    main()
