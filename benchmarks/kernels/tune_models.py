"""The whole-model suite on this GPU, tuned once per model with each candidate's ms and J per call measured, then
judged under both objectives: the winner under `energy` (joules per call above idle, the efficiency policy's) and
under `time` (the throughput policy's), each against the baseline the job would run untuned, with the winner's
gain over that baseline and over torch.compile's default.

    python benchmarks/kernels/tune_models.py [--budget-s 90] [--rtol 1e-4] [--only NAME ...] [--families ...]
        [--time-limit-s S] [--out models.json] [--policy policy.json]
    python benchmarks/kernels/tune_models.py --merge a.json b.json    # one suite's tables from runs in parts
                                                                      # (a model in both: b's run)

GPU only (the energy figures come from NVML's counter: ~2 s of back-to-back calls per candidate). The rtol decides
the baseline: strict fp32 eager below 1e-3, PyTorch's defaults (cuDNN TF32) from 1e-3.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

MODELS = Path(__file__).resolve().parent / "models"
ROOT = MODELS.parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]

from farm.core.tuning import Objective  # noqa: E402
from farm_agent.tuner.policy import Policy  # noqa: E402
from farm_agent.tuner.problem import problem_paths  # noqa: E402
from farm_agent.tuner.tune import TuneReport, choose, summarize, tune  # noqa: E402

FAMILIES = ("compile-default", "cuda-graph", "compile-reduce-overhead", "channels-last", "compile-max-autotune",
            "triton-fused", "triton-templates-3xtf32", "triton-templates-3xtf32-graph",
            "triton-templates-3xtf32-compile-graph", "tf32", "compile-tf32", "autocast-bf16", "autocast-fp16")


def rows(report: TuneReport) -> list[dict[str, object]]:
    """One line per objective: the winner against the baseline and compile-default, in ms and J per call."""
    base, compiled = report.trial(report.baseline), report.trial("compile-default")
    out = []
    for objective in (Objective.ENERGY, Objective.TIME):
        won = choose(report.trials, report.baseline, objective)
        def ratio(ref: object) -> float | None:
            a = ref.on(objective) if ref is not None else None  # type: ignore[attr-defined]
            b = won.on(objective) if won is not None else None
            return a / b if a and b else None
        sol = report.speed_of_light()
        out.append({"model": report.problem, "objective": objective.value, "baseline": report.baseline,
                    "winner": won.candidate if won else None, "ms": won.median_ms if won else None,
                    "sol_share": sol.share(won.median_ms) if sol is not None and won is not None else None,
                    "sol_bound": sol.bound if sol is not None else None,
                    "j": won.joules_per_call if won else None, "base_ms": base.median_ms if base else None,
                    "base_j": base.joules_per_call if base else None, "vs_base": ratio(base),
                    "vs_compile": ratio(compiled)})
    return out


def table(lines: list[dict[str, object]]) -> str:
    def f(v: object, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, float) else "-"
    head = (f"{'model':<22} {'objective':<9} {'winner':<24} {'ms/call':>8} {'J/call':>8} {'baseline':<17} "
            f"{'base ms':>8} {'base J':>8} {'vs base':>8} {'vs compile':>10} {'of SoL':>7} {'bound':<7}")
    body = [f"{r['model']:<22} {r['objective']:<9} {str(r['winner'])[:24]:<24} {f(r['ms'], '8.3f')} "
            f"{f(r['j'], '8.3f')} {r['baseline']:<17} {f(r['base_ms'], '8.3f')} {f(r['base_j'], '8.3f')} "
            f"{f(r['vs_base'], '7.2f')}x {f(r['vs_compile'], '9.2f')}x "
            f"{format(r['sol_share'], '7.1%') if isinstance(r['sol_share'], float) else '      -'} "
            f"{r['sol_bound'] or '-':<7}" for r in lines]
    return "\n".join([head, *body])


def goals(reports: list[TuneReport]) -> str:
    """Issue 29's figures for the suite, per objective: strict fast_1.05 against compile-default and the geometric
    mean of the picks' gains over it (time, or joules per call), and each pick under 5 % of the speed of light. A
    pick is the cheapest candidate correct at the run's tolerance that keeps fp32 arithmetic (TuneReport.pick,
    "strict"), as the evaluator counts; the rows above show what a job would run (`choose`: a winner must beat the
    baseline by the margin, and may lower precision where the tolerance allows)."""
    out = []
    for objective in (Objective.ENERGY, Objective.TIME):
        s = summarize(reports, "strict", 0.05, objective)
        low = [f"{r.problem} ({share:.1%})" for r in reports
               if (share := r.sol_share("strict", objective)) is not None and share < 0.05]
        out.append(f"{objective.value}: strict fast_1.05 vs compile {s.fast_p:.1%} of {s.problems}; geomean "
                   f"{s.geomean_vs_compile or 0:.2f}x vs compile, {s.geomean_vs_eager or 0:.2f}x vs eager; "
                   f"under 5 % of the speed of light: {', '.join(low) or 'none'}")
    return "\n".join(out)


def load_reports(path: Path) -> list[TuneReport]:
    """The reports an --out file holds (the rows are made again from them)."""
    return [TuneReport.from_json(data) for data in json.loads(path.read_text())["reports"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=90.0)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--time-limit-s", type=float, default=None, help="start no model after this many seconds")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--policy", type=Path, default=None,
                        help="the tuner's policy to start from and save after every model (an agent's is "
                             "~/.farm/tuner/policy.json): what the suite taught it, for a node of this GPU kind")
    parser.add_argument("--merge", nargs="+", type=Path, default=None, help="--out files: their tables, together")
    args = parser.parse_args()
    if args.merge:
        # A later file's run of a model replaces an earlier one's (a re-run with more budget, say).
        merged = list({r.problem: r for path in args.merge for r in load_reports(path)}.values())
        print(table([line for report in merged for line in rows(report)]) + "\n\n" + goals(merged))
        return
    started = time.monotonic()
    policy = Policy.load(args.policy) if args.policy else Policy()
    lines: list[dict[str, object]] = []
    reports: list[TuneReport] = []
    for path in problem_paths(MODELS):
        if args.only and path.stem not in args.only:
            continue
        if args.time_limit_s is not None and time.monotonic() - started > args.time_limit_s:
            print(f"time limit: {path.stem} and the models after it not run", flush=True)
            break
        report = tune(path, budget_s=args.budget_s, atol=args.rtol, rtol=args.rtol, policy=policy,
                      candidates=args.families, objective=Objective.ENERGY, runs=10, candidate_timeout_s=120.0)
        lines += rows(report)
        reports.append(report)
        print(table(lines[-2:]).split("\n", 1)[1], flush=True)
        for t in report.trials:  # every candidate measured (the rows are each objective's winner)
            print(f"    {t.candidate:<38} {t.median_ms or 0:8.3f} ms {t.joules_per_call or 0:8.3f} J "
                  f"{t.seconds:6.1f} s{'' if t.correct else '  wrong/failed: ' + str(t.error)[:150]}", flush=True)
        if args.policy:
            policy.save(args.policy)
        if args.out:  # after every model: a call cut short keeps what it measured
            args.out.write_text(json.dumps({"rows": lines, "reports": [asdict(r) for r in reports]}, indent=1,
                                           default=str))
    print("\n" + table(lines) + "\n\n" + goals(reports))


if __name__ == "__main__":
    main()
