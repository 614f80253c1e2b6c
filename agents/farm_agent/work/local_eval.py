"""Kernel evaluation on this machine, for the CLI's `farm kernels propose` without a head: each round's proposals
through the hardened evaluator here, and the winner kept in the optimizer's winner cache for this device. With the
agent, not the client: it runs the evaluator (and torch); farm.client.proposer takes it as an Evaluator."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from farm.core.kernels import KernelResult, RewardMode

Evaluator = Callable[[Path, Sequence[str]], list[KernelResult]]  # farm.client.proposer's shape


def local_evaluator(device: str, *, reward: RewardMode = RewardMode.SPEEDUP, runs: int = 20, timeout_s: float = 60.0,
                    memory_mb: int | None = 4096, atol: float = 1e-4, rtol: float = 1e-4,
                    compile_baseline: bool = True) -> Evaluator:
    """Evaluate on this machine with the hardened evaluator: the eager baseline each round, and torch.compile's unless
    compile_baseline is False (compiling takes a while on a CPU)."""

    def evaluate(problem: Path, sources: Sequence[str]) -> list[KernelResult]:
        from farm_agent.work.kinds.kernel_eval import baseline_times, row
        from farm_agent.tuner.evaluator import COMPILE_DEFAULT, Candidate
        from farm_agent.tuner.evaluator import evaluate as run

        with tempfile.TemporaryDirectory(prefix="farm-propose-") as folder:
            files = []
            for i, text in enumerate(sources):
                path = Path(folder) / f"proposal_{i}.py"
                path.write_text(text)
                files.append(Candidate(name=f"proposal_{i}", file=path))
            rows = []
            checked = _checked(files)
            baselines = [COMPILE_DEFAULT] if compile_baseline else []
            results = run(problem, [*baselines, *checked.values()], device=device, atol=atol, rtol=rtol,
                          runs=runs, timeout_s=timeout_s,
                          memory_limit_bytes=memory_mb * 2**20 if memory_mb else None)
            by_name = {r.candidate: r for r in results}
            eager_ms, compile_ms = baseline_times(results)
            for candidate in files:
                if candidate.name in by_name:
                    rows.append(row(problem.stem, candidate.name, by_name[candidate.name], eager_ms, compile_ms,
                                    reward, 0.05, device))
                else:
                    rows.append(_unusable(problem.stem, candidate.name, checked_error(candidate), reward, device))
            return rows

    return evaluate


def _checked(files: list[Any]) -> dict[str, Any]:
    """The candidate files that parse and define ModelNew (the others are failed rows, never evaluated)."""
    return {c.name: c for c in files if checked_error(c) is None}


def checked_error(candidate: Any) -> str | None:
    from farm.core.errors import FarmError
    from farm_agent.tuner.problem import candidate_defines_model_new

    try:
        candidate_defines_model_new(candidate.file)
    except FarmError as exc:
        return f"not a candidate: {exc.message}"
    return None


def _unusable(problem: str, name: str, error: str | None, mode: RewardMode, device: str) -> KernelResult:
    from farm.core.kernels import reward

    return KernelResult(problem=problem, candidate=name, compiled=False, correct=False, max_abs_err=None,
                        rel_norm_err=None, median_ms=None, eager_ms=None, compile_ms=None, speedup_vs_eager=None,
                        speedup_vs_compile=None, reward=reward(mode, False, None, None), error=error or "",
                        device=device)


def local_winner_cache(device: str, atol: float = 1e-4, rtol: float = 1e-4,
                       folder: Path | None = None) -> Callable[[Path, KernelResult, str], str | None]:
    """Keep a winner in the optimizer's winner cache, under the problem's model and inputs on this device."""

    def remember(problem: Path, result: KernelResult, source: str) -> str | None:
        from farm_agent.tuner.cache import Winner, WinnerCache, make_key
        from farm_agent.tuner.problem import load_problem

        loaded = load_problem(problem)
        key = make_key(loaded.model(device), loaded.inputs(device, seed=0), atol, rtol, device)
        winner = Winner(candidate=f"proposed:{result.candidate}", params={}, lowers_precision=result.lowers_precision,
                        median_ms=float(result.median_ms or 0.0), eager_ms=result.eager_ms,
                        compile_ms=result.compile_ms, source=source)
        return str(WinnerCache(folder).put(key, winner, extra={"problem": loaded.name}))

    return remember
