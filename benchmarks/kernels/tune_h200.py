"""The optimizer over a set of problems on this GPU: strict, strict-ieee and loose tables with fast_1.05, the
geometric-mean speedups over eager and torch.compile, each winner's share of the speed of light and the search time.

    python benchmarks/kernels/tune_h200.py benchmarks/kernels/problems [--time-limit-s 520] [--check-workers 8]
        [--check-limit-s 170] [--families eager compile-default triton-templates ...] [--runs 10] [--only NAME ...]
        [--max-autotune] [--objective time|energy] [--out h200.json] [--tables DIR]
    python benchmarks/kernels/tune_h200.py --merge a/h200.json b/h200.json --tables DIR   # runs in parts, together

1. Template check (template_check.py, parallel processes): every problem's template regions compiled (at the
   precisions of the template families asked for) and checked against eager, failures recorded (a template that does not compile is skipped, never fatal), and the Triton and
   Inductor disk caches warmed, so that the timed phase measures rather than compiles.
2. Timed phase, one problem at a time, problems with template regions first: each problem tuned once at the loose
   tolerance with every offered candidate of --families measured by the hardened evaluator (its times are the
   verdict; the templates' autotuning only searches), and judged under the three scorings from its recorded errors:
   strict (1e-4, no precision lowering; split-TF32 allowed, marked with a dagger), strict-ieee (1e-4, fp32 products
   only) and loose (1e-2).
3. If time is left: torch.compile's max-autotune as a further baseline, problem by problem (--max-autotune).

With `--objective energy` each candidate's joules per call above idle are read too (NVML's counter over its own
run of >= 20 of the counter's steps: ~2 s more a candidate), and every table comes twice: ranked and compared by
time (strict.txt, ...) and by joules per call (strict-energy.txt, ...), both from the same trials.

Results are written after every problem, so a run cut short keeps what it measured: JSON to --out, and the tables
(strict.txt, strict-ieee.txt, loose.txt, summary.txt) to --tables.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents"), str(ROOT / "benchmarks" / "kernels")]

from farm.core.tuning import Objective  # noqa: E402
from farm_agent.tuner.candidates import candidate  # noqa: E402
from farm_agent.tuner.evaluator import evaluate  # noqa: E402
from farm_agent.tuner.policy import Policy  # noqa: E402
from farm_agent.tuner.problem import problem_paths  # noqa: E402
from farm_agent.tuner.tune import LOOSE, STRICT, TuneReport, format_table, summarize, tune  # noqa: E402

SCORINGS = ("strict", "strict-ieee", "loose")
# The default candidate set: the baselines, the fp32 template families, fp16 autocast, the cheap precision-lowering
# candidate that won most of the loose column before (docs/kernels-h200.md), and the two CUDA-graph families, which
# remove launch overhead where it rules (whole models: issue 29; each refuses a model one static graph cannot hold);
# the rest (triton-templates-tf32 among them: a third set of template compiles) cost time that ~9 minutes for 56
# problems do not have.
DEFAULT_FAMILIES = ("eager", "compile-default", "triton-templates", "triton-templates-3xtf32", "autocast-fp16",
                    "cuda-graph", "compile-reduce-overhead")
FAMILY_PRECISION = {"triton-templates": "ieee", "triton-templates-compile": "ieee", "triton-templates-3xtf32": "tf32x3",
                    "triton-templates-tf32": "tf32"}


def region_count(path: Path) -> int:
    """The problem's template regions, found on the meta device (no memory, no compute)."""
    from farm_agent.tuner.problem import load_problem
    from farm_agent.tuner.templates.matcher import rewrite

    try:
        problem = load_problem(path)
        return sum(rewrite(problem.model("meta"), problem.inputs("meta", seed=0), "tf32x3")[1].values())
    except Exception:  # noqa: BLE001 - a problem the matcher cannot shape-propagate on meta: no regions
        return 0


def checked_families(name: str, families: list[str], check: dict[str, Any]) -> list[str]:
    """The families to measure for a problem: a template family only where the check compiled its templates
    (a template not yet compiled would be compiled inside the evaluator's timeout, where one model's dozens of
    configs can use it all)."""
    if not check:
        return families
    precisions = check.get("problems", {}).get(name, {}).get("precisions", {})
    kept = []
    for family in families:
        precision = FAMILY_PRECISION.get(family)
        entry = precisions.get(precision) if precision else None
        if precision is None or (entry and entry.get("regions") and not entry.get("error")
                                 and not entry.get("failed_regions")):
            kept.append(family)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="*", type=Path)
    parser.add_argument("--time-limit-s", type=float, default=520.0, help="start no problem after this many seconds")
    parser.add_argument("--check-workers", type=int, default=8, help="template check processes (0: no check)")
    parser.add_argument("--check-limit-s", type=float, default=170.0)
    parser.add_argument("--families", nargs="+", default=list(DEFAULT_FAMILIES))
    parser.add_argument("--only", nargs="*", default=None, help="problem names (file stems): only these")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--candidate-timeout-s", type=float, default=90.0)
    parser.add_argument("--max-autotune", action="store_true", help="compile max-autotune where time is left")
    parser.add_argument("--policy", type=Path, default=None, help="policy state to start from and update")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--objective", choices=[o.value for o in Objective], default=Objective.TIME.value,
                        help="energy: each candidate's joules per call read too, and tables under both objectives")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tables", type=Path, default=None, help="folder for the text tables")
    parser.add_argument("--merge", nargs="+", type=Path, default=None,
                        help="--out files of runs in parts (ONLY=...): their tables and summary, together")
    args = parser.parse_args()
    if args.merge:
        merge(args)
        return
    if not args.problems:
        parser.error("a folder of problems, or --merge")

    started = time.perf_counter()
    paths = [p for folder in args.problems for p in problem_paths(folder)]
    if args.only:
        paths = [p for p in paths if p.stem in set(args.only)]
    precisions = sorted({FAMILY_PRECISION[f] for f in args.families if f in FAMILY_PRECISION})
    counts = {p.stem: region_count(p) for p in paths}
    check: dict[str, Any] = {}
    if args.check_workers > 0 and precisions:
        from template_check import check_all, sized_workers

        workers = sized_workers(args.check_workers, device=args.device)  # as many as the GPU's free memory holds
        print(f"== template check: {len(paths)} problems, {workers} workers", flush=True)
        heaviest_first = sorted(paths, key=lambda p: -counts[p.stem])  # the longest compiles start first
        check = check_all(heaviest_first, precisions, workers, args.check_limit_s, device=args.device)
        print(f"== template check done in {check['wall_s']:.0f} s", flush=True)

    # Problems with template regions first, so that a time limit cuts the ones the templates do not touch.
    paths.sort(key=lambda p: (counts[p.stem] == 0, p.stem))
    policy = Policy.load(args.policy)
    reports: list[TuneReport] = []
    failures: dict[str, str] = {}
    state = {"args": args, "started": started, "check": check, "paths": paths}
    for path in paths:
        if time.perf_counter() - started > args.time_limit_s:
            failures[path.stem] = "not run: time limit"
            continue
        families = checked_families(path.stem, args.families, check)
        if families != args.families and counts[path.stem]:
            print(f"{path.stem}: left out, their templates not checked: "
                  f"{sorted(set(args.families) - set(families))}", flush=True)
        try:
            report = tune(path, budget_s=1e9, atol=LOOSE[0], rtol=LOOSE[1], device=args.device, policy=policy,
                          runs=args.runs, exhaustive=True, candidates=families,
                          candidate_timeout_s=args.candidate_timeout_s, objective=Objective(args.objective))
        except Exception as exc:  # noqa: BLE001 - one broken problem must not cost the rest of the run
            failures[path.stem] = f"{type(exc).__name__}: {exc}"
            print(f"{path.stem}: {failures[path.stem]}", flush=True)
            continue
        reports.append(report)
        policy.save(args.policy)
        best = report.pick("strict")
        share = report.sol_share("strict")
        print(f"{report.problem}: strict {best.candidate if best else None} "
              f"x{report.speedup('compile-default', 'strict') or 0:.2f} vs compile, "
              f"{f'{share:.1%}' if share is not None else '-'} of SoL, {report.seconds:.0f} s "
              f"({time.perf_counter() - started:.0f} s elapsed)", flush=True)
        for t in report.trials:
            if t.error and not t.correct_loose:
                print(f"    {t.candidate}: {t.error[:200]}", flush=True)
        write(state, reports, failures)
    if args.max_autotune:
        max_autotune(reports, args, started, lambda: write(state, reports, failures))
    write(state, reports, failures)
    for objective in objectives(args):
        for scoring in SCORINGS:
            print(f"\n== {scoring} ({objective.value}) ==")
            print(format_table(reports, scoring, objective=objective))
    print("\n" + summary_text(reports, failures, check, time.perf_counter() - started, objectives(args)))


def merge(args: argparse.Namespace) -> None:
    """One run's tables from runs in parts: a later file's report of a problem replaces an earlier one's; each
    file's failures count where no file measured the problem."""
    reports: dict[str, TuneReport] = {}
    failures: dict[str, str] = {}
    check: dict[str, Any] = {"problems": {}, "wall_s": 0.0}
    wall = 0.0
    for path in args.merge:
        data = json.loads(path.read_text())
        reports |= {r.problem: r for r in map(TuneReport.from_json, data["reports"])}
        failures |= data.get("failures", {})
        check["problems"] |= (data.get("template_check") or {}).get("problems", {})
        check["wall_s"] += (data.get("template_check") or {}).get("wall_s", 0.0)
        wall += data.get("wall_s", 0.0)
        if args.objective == Objective.TIME.value and any(t.get("joules_per_call") is not None
                                                          for r in data["reports"] for t in r["trials"]):
            args.objective = Objective.ENERGY.value
    failures = {name: why for name, why in failures.items() if name not in reports}
    args.out = None  # the parts' JSON files stay the record
    state = {"args": args, "started": time.perf_counter() - wall, "check": check}
    merged = sorted(reports.values(), key=lambda r: r.problem)
    write(state, merged, failures)
    for objective in objectives(args):
        for scoring in SCORINGS:
            print(f"\n== {scoring} ({objective.value}) ==")
            print(format_table(merged, scoring, objective=objective))
    print("\n" + summary_text(merged, failures, check, wall, objectives(args)))


def objectives(args: argparse.Namespace) -> tuple[Objective, ...]:
    """The objectives the run's trials can be judged on: time always; energy where their joules were read."""
    return (Objective.TIME, Objective.ENERGY) if args.objective == Objective.ENERGY.value else (Objective.TIME,)


def max_autotune(reports: list[TuneReport], args: argparse.Namespace, started: float,
                 written: Callable[[], None]) -> None:
    """compile-max-autotune (TF32 off) per problem while time is left: a baseline in report.extra."""
    for report in reports:
        if time.perf_counter() - started > args.time_limit_s:
            break
        path = next((p for folder in args.problems for p in problem_paths(folder) if p.stem == report.problem),
                    None)
        if path is None:
            continue
        try:
            results = evaluate(path, [candidate("compile-max-autotune")], device=args.device, atol=STRICT[0],
                               rtol=STRICT[1], runs=args.runs, timeout_s=args.candidate_timeout_s)
        except Exception as exc:  # noqa: BLE001
            report.extra["compile_max_autotune_error"] = f"{type(exc).__name__}: {exc}"
            continue
        result = results[-1]
        report.extra["compile_max_autotune_ms"] = result.median_ms if result.sound else None
        report.extra["compile_max_autotune_error"] = result.error
        written()


def summary_text(reports: list[TuneReport], failures: dict[str, str], check: dict[str, Any], wall_s: float,
                 judged: tuple[Objective, ...] = (Objective.TIME,)) -> str:
    """fast_1.05 and the geometric means under each scoring and objective, over all problems and over those with
    template regions; the search time; template compile failures."""
    lines = []
    templated = {name for name, e in check.get("problems", {}).items()
                 if any(p.get("regions") or p.get("error") for p in e.get("precisions", {}).values())}
    groups = [("all problems", reports), ("problems with template regions", [r for r in reports
                                                                            if r.problem in templated])]
    for label, group in groups:
        if not group:
            continue
        lines.append(f"{label} ({len(group)}):")
        for objective, scoring in ((o, scoring) for o in judged for scoring in SCORINGS):
            s = summarize(group, scoring, 0.05, objective)
            num = (lambda v, f: format(v, f) if v is not None else "-")  # noqa: E731
            lines.append(f"  {scoring:<12} {objective.value:<7} fast_1.05 {s.fast_p:6.1%}  geomean "
                         f"{num(s.geomean_vs_eager, '.2f')}x vs "
                         f"eager, {num(s.geomean_vs_compile, '.2f')}x vs compile, "
                         f"{num(s.geomean_sol_share, '.1%')} of the speed of light (geomean), correct {s.correct}")
    search = sum(r.seconds for r in reports)
    lines.append(f"search time: {search:.0f} s over {len(reports)} problems "
                 f"(median {sorted(r.seconds for r in reports)[len(reports) // 2] if reports else 0:.1f} s); "
                 f"template check {check.get('wall_s', 0):.0f} s; wall {wall_s:.0f} s")
    ma = [(r.problem, r.extra["compile_max_autotune_ms"]) for r in reports if r.extra.get("compile_max_autotune_ms")]
    if ma:
        ratios = []
        for r in reports:
            base = r.extra.get("compile_max_autotune_ms")
            best = r.pick("strict")
            if base and best and best.median_ms:
                ratios.append(base / best.median_ms)
        if ratios:
            lines.append(f"compile max-autotune measured on {len(ratios)} problems: strict geomean "
                         f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x vs it")
    compile_failures = {name: {p: e.get("failures") or e.get("error") for p, e in entry.get("precisions", {}).items()
                               if e.get("failures") or e.get("error")}
                        for name, entry in check.get("problems", {}).items()}
    compile_failures = {k: v for k, v in compile_failures.items() if v}
    if compile_failures:
        lines.append(f"templates that failed to compile or run (their regions ran in PyTorch): "
                     f"{json.dumps(compile_failures)[:4000]}")
    for name, why in failures.items():
        lines.append(f"{name}: {why}")
    left = [name for name, why in failures.items() if why == "not run: time limit"]
    if left:
        lines.append(f'the rest, in a second call: ONLY="{" ".join(left)}" bash benchmarks/gpu/kernels_on_h200.sh')
    return "\n".join(lines)


def write(state: dict[str, Any], reports: list[TuneReport], failures: dict[str, str]) -> None:
    args = state["args"]
    wall = time.perf_counter() - state["started"]
    if args.out:
        data = {
            "command": " ".join(sys.argv),
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            "torch": torch.__version__,
            "triton": _triton_version(),
            "wall_s": wall,
            "families": args.families,
            "summary": {s: asdict(summarize(reports, s)) for s in SCORINGS},
            "summary_by_objective": {o.value: {s: asdict(summarize(reports, s, objective=o)) for s in SCORINGS}
                                     for o in objectives(args)},
            "reports": [r.to_json() for r in reports],
            "failures": failures,
            "template_check": state["check"],
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1, default=str))
    if args.tables:
        args.tables.mkdir(parents=True, exist_ok=True)
        for objective, scoring in ((o, s) for o in objectives(args) for s in SCORINGS):
            name = scoring if objective is Objective.TIME else f"{scoring}-{objective.value}"
            (args.tables / f"{name}.txt").write_text(format_table(reports, scoring, objective=objective) + "\n")
        (args.tables / "summary.txt").write_text(summary_text(reports, failures, state["check"], wall,
                                                               objectives(args)) + "\n")


def _triton_version() -> str | None:
    try:
        import triton

        return str(triton.__version__)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    main()
