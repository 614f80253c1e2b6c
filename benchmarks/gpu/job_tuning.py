"""A job's tuning run alone, on the lent GPU machine: what a shard's `tune_budget_s` run measures in its budget, and
where its seconds go (issue 29). The model is benchmarks/gpu/tuned_job.py's (`convnext` by default), on a batch of
the job's uint8 images, tuned as a shard tunes it (farm_agent.tuner.tune.tuned_forward, tune_first, the job
policy's objective) in a fresh winners cache, for each tolerance asked. Prints one block a run: the run's seconds,
its reason, and each candidate's ms and joules per call and the seconds measuring it took (where the code says).

    python benchmarks/gpu/job_tuning.py [--model convnext] [--batch-size 512] [--budget 45] [--rtol 1e-4 1e-3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="convnext")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--budget", type=float, default=45.0)
    parser.add_argument("--rtol", type=float, nargs="+", default=[1e-4, 1e-3])
    parser.add_argument("--objective", choices=("energy", "time"), default="energy")
    parser.add_argument("--label", default="")
    args = parser.parse_args()

    import torch

    from benchmarks.gpu.auto_shards import SHAPE
    from benchmarks.gpu.tuned_job import MODELS
    from farm.core.tuning import Objective
    from farm_agent.tuner.cache import WinnerCache
    from farm_agent.tuner.tune import tuned_forward

    module_name, _, attr = MODELS[args.model].partition(":")
    build = getattr(__import__(module_name, fromlist=[attr]), attr)
    model = build().to("cuda")
    batch = torch.randint(0, 256, (args.batch_size, SHAPE[0] * SHAPE[1] * SHAPE[2]), dtype=torch.uint8,
                          device="cuda")
    for rtol in args.rtol:
        with tempfile.TemporaryDirectory() as folder, torch.inference_mode():  # as a shard runs it
            began = time.perf_counter()
            _, outcome = tuned_forward(model, batch, (rtol, rtol), "cuda", WinnerCache(Path(folder)),
                                       tune_first=True, budget_s=args.budget, objective=Objective(args.objective))
            wall = time.perf_counter() - began
        print(f"## {args.label} {args.model} batch {args.batch_size}, tolerance {rtol:g}, budget {args.budget:g} s, "
              f"objective {args.objective}: {wall:.1f} s in all, tuning {outcome.tuning_s:.1f} s, "
              f"{'-' if outcome.tuning_j is None else f'{outcome.tuning_j:,.0f}'} J above idle; "
              f"winner {outcome.winner or 'untuned'}")
        print(f"  {outcome.reason}")
        for figures in outcome.candidates:
            print(f"  {figures.describe()}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
