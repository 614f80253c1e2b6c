"""The optimizer over a set of problems on this GPU: the H200 table, under strict (1e-4) and loose (1e-2) scoring.

    python benchmarks/kernels/tune_h200.py benchmarks/kernels/problems [--budget-s 60] [--exhaustive]
        [--skip compile-max-autotune] [--time-limit-s 540] [--out docs/kernels-h200.json]

Each problem is tuned once at the loose tolerance, so that every candidate (precision-lowering ones too) is offered;
each candidate is measured once and judged under both tolerances from its recorded errors. The strict pick is the
fastest candidate that keeps fp32 arithmetic and passes 1e-4; the loose pick, the fastest that passes 1e-2. The
policy learns as the run goes (state in FARM_STATE_DIR/tuner/policy.json, or --policy). Results are written after
every problem, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]

from farm_agent.tuner.policy import Policy  # noqa: E402
from farm_agent.tuner.problem import problem_paths  # noqa: E402
from farm_agent.tuner.tune import LOOSE, format_table, summarize, tune  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--exhaustive", action="store_true", help="measure every candidate (no budget, no stop)")
    parser.add_argument("--skip", nargs="*", default=[], help="candidate families to leave out")
    parser.add_argument("--time-limit-s", type=float, default=None, help="start no problem after this many seconds")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--candidate-timeout-s", type=float, default=180.0)
    parser.add_argument("--policy", type=Path, default=None, help="policy state to start from and update")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shuffle-seed", type=int, default=None,
                        help="tune the problems in a random order (a time limit then cuts a random subset)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    paths = [p for folder in args.problems for p in problem_paths(folder)]
    if args.shuffle_seed is not None:
        random.Random(args.shuffle_seed).shuffle(paths)
    policy = Policy.load(args.policy)
    started = time.perf_counter()
    reports = []
    failures: dict[str, str] = {}
    from farm_agent.tuner.candidates import FAMILIES

    allowed = [f.name for f in FAMILIES if f.name not in args.skip]
    for path in paths:
        if args.time_limit_s is not None and time.perf_counter() - started > args.time_limit_s:
            failures[path.stem] = "not run: time limit"
            continue
        try:
            report = tune(path, budget_s=args.budget_s, atol=LOOSE[0], rtol=LOOSE[1], device=args.device,
                          policy=policy, runs=args.runs, exhaustive=args.exhaustive, candidates=allowed,
                          candidate_timeout_s=args.candidate_timeout_s)
        except Exception as exc:  # one broken problem must not cost the rest of the run
            failures[path.stem] = f"{type(exc).__name__}: {exc}"
            print(f"{path.stem}: {failures[path.stem]}", flush=True)
            continue
        reports.append(report)
        policy.save(args.policy)
        best = report.pick("loose")
        print(f"{report.problem}: loose {best.candidate if best else None} "
              f"x{report.speedup('compile-default', 'loose') or 0:.2f} vs compile, {report.seconds:.0f} s", flush=True)
        if args.out:
            write(args, reports, failures, started)
    if args.out:
        write(args, reports, failures, started)
    for scoring in ("strict", "loose"):
        print(f"\n== {scoring} ==")
        print(format_table(reports, scoring))
    for name, why in failures.items():
        print(f"{name}: {why}")


def write(args: argparse.Namespace, reports: list, failures: dict[str, str], started: float) -> None:
    data = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "wall_s": time.perf_counter() - started,
        # benchmarks/kernels/evaluator_fixes: whether the worker ran with those two fixes
        "evaluator_fixes": os.environ.get("FARM_EVALUATOR_FIXES") == "1",
        "summary": {s: asdict(summarize(reports, s)) for s in ("strict", "loose")},
        "reports": [r.to_json() for r in reports],
        "failures": failures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, default=str))


if __name__ == "__main__":
    main()
