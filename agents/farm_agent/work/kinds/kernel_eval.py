"""Runs one shard of a kernel-eval job in the device's persistent worker: one problem's candidates through the
hardened evaluator, its eager and torch.compile baselines measured once for all of them. The job's code (the
problems and candidates folders) is its cwd.

Every candidate runs in a child process of its own with the job's time and memory limits: a crash, a hang or a CUDA
fault fails that candidate's row, never this worker, the node or the job.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from farm.core.errors import FarmError
from farm.core.tasks import ResultRoute, ShardFigures
from farm.core.kernels import (
    COLUMNS, KernelEvalShardResult, KernelEvalTask, KernelPair, KernelResult, RewardMode, reward, speedup,
)
from farm_agent.work.capture import job_shard
from farm_agent.power import meter_for

if TYPE_CHECKING:
    from farm_agent.tuner.evaluator import Result
    from farm_agent.work.upload import Finishing


@job_shard
def run_kernel_shard(task: KernelEvalTask) -> KernelEvalShardResult:
    import ray

    from farm_agent.tuner.evaluator import COMPILE_DEFAULT, Candidate, evaluate
    from farm_agent.tuner.problem import candidate_defines_model_new

    root = Path.cwd()
    problem = root / task.pairs[0].problem
    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""  # a lent node has no Ray
    rows: dict[KernelPair, KernelResult] = {}
    runnable: dict[str, KernelPair] = {}  # evaluator candidate name -> pair
    for pair in task.pairs:
        try:  # parses and defines ModelNew, checked without running it
            candidate_defines_model_new(root / pair.candidate)
            runnable[f"file:{pair.candidate}"] = pair
        except FarmError as exc:
            rows[pair] = _failed(pair, f"not a candidate: {exc.message}", task)
    candidates = [COMPILE_DEFAULT,
                  *(Candidate(name=name, file=root / pair.candidate) for name, pair in runnable.items())]
    began = time.perf_counter()
    with meter_for(task.device).window() as window:
        try:
            results: list[Result] = evaluate(
                problem, candidates, device=task.device, atol=task.atol, rtol=task.rtol, runs=task.runs,
                timeout_s=task.timeout_s,
                memory_limit_bytes=task.memory_mb * 2**20 if task.memory_mb else None,
            )
        except FarmError as exc:  # the problem itself does not load or run: nothing of it can be judged
            results = []
            for pair in runnable.values():
                rows[pair] = _failed(pair, f"problem: {exc.message}", task)
    seconds = time.perf_counter() - began
    by_name = {r.candidate: r for r in results}
    eager_ms, compile_ms = baseline_times(results)
    for name, pair in runnable.items():
        if (result := by_name.get(name)) is not None:
            rows[pair] = row(pair.stem, pair.name, result, eager_ms, compile_ms, task.reward, task.margin, task.device)
    ordered = [rows[pair] for pair in task.pairs]
    return KernelEvalShardResult(
        rows=ordered, items=len(ordered), seconds=seconds, correct=sum(r.correct for r in ordered),
        node_ray_id=node, energy=window.energy,
    )


def rows_table(rows: list[KernelResult]) -> pa.Table:
    """A shard's rows as the table its upload carries (the head writes them as JSON lines)."""
    return pa.Table.from_pylist([r.to_dict() for r in rows],
                                schema=None if rows else pa.schema([(name, pa.null()) for name in COLUMNS]))


def baseline_times(results: list[Result]) -> tuple[float | None, float | None]:
    """The eager and compile-default medians of one evaluation (None where that baseline is not correct)."""
    by_name = {r.candidate: r for r in results}
    eager, compiled = by_name.get("eager"), by_name.get("compile-default")
    return (eager.median_ms if eager is not None and eager.correct else None,
            compiled.median_ms if compiled is not None and compiled.correct else None)


def row(problem: str, candidate: str, result: Result, eager_ms: float | None, compile_ms: float | None,
        mode: RewardMode, margin: float, device: str) -> KernelResult:
    """One evaluator Result as a results-table row, with its speedups and reward."""
    vs_eager = speedup(eager_ms, result.median_ms, result.correct)
    vs_compile = speedup(compile_ms, result.median_ms, result.correct)
    data = result.to_dict()  # infinities as None
    sol = result.speed_of_light()
    share = sol.share(result.median_ms) if sol is not None and result.correct else None
    return KernelResult(
        problem=problem, candidate=candidate, compiled=result.compiled, correct=result.correct,
        max_abs_err=data["max_abs_err"], rel_norm_err=data["rel_norm_err"], median_ms=result.median_ms,
        eager_ms=eager_ms, compile_ms=compile_ms, speedup_vs_eager=vs_eager, speedup_vs_compile=vs_compile,
        reward=reward(mode, result.correct, vs_eager, vs_compile, margin), error=result.error,
        device=device, lowers_precision=result.lowers_precision, sol_share=share,
        sol_bound=sol.bound if sol is not None else "", sol_peaks=sol.peaks.describe() if sol is not None else "",
    )


def _failed(pair: KernelPair, error: str, task: KernelEvalTask) -> KernelResult:
    return KernelResult(
        problem=pair.stem, candidate=pair.name, compiled=False, correct=False, max_abs_err=None, rel_norm_err=None,
        median_ms=None, eager_ms=None, compile_ms=None, speedup_vs_eager=None, speedup_vs_compile=None,
        reward=reward(task.reward, False, None, None, task.margin), error=error, device=task.device,
    )


def attempt(task: KernelEvalTask, route: ResultRoute) -> ShardFigures | Finishing | None:
    """One problem's candidates through the hardened evaluator, in its worker: its rows as the table."""
    from farm_agent.work.upload import Upload, figures, send

    def work(upload: Upload) -> ShardFigures:
        result = run_kernel_shard(task)
        upload.write(rows_table(result.rows))
        return figures(result)

    return send(route, work)
