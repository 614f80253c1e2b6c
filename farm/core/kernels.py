"""Kernel-evaluation jobs, the pure part: which candidate goes with which problem, how pairs become shards, what a
result row holds and what reward it earns. No I/O: names in, pairs, ranges and rewards out.

Layout of a job's code (as `farm.client.kernels.pack` builds it from the spec's two folders):

    <problems>/<stem>.py               one problem each: class Model, get_inputs(), get_init_inputs()
    <candidates>/<stem>/<name>.py      candidates for problem <stem>: each defines class ModelNew

Files whose name starts with '_' are helpers (imported by their neighbours), never problems or candidates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from farm.core.energy import Energy
from farm.core.errors import SpecError

BASELINES = ("eager", "compile-default")


class RewardMode(StrEnum):
    SPEEDUP = "speedup"  # eager time / candidate time when correct, else 0
    MILESTONES = "milestones"  # -1 incorrect; 1 correct; 2 faster than eager by the margin; 3 than eager and compile


@dataclass(frozen=True)
class KernelPair:
    problem: str  # the problem file, relative to the job's code
    candidate: str  # the candidate file, relative to the job's code

    @property
    def stem(self) -> str:
        return self.problem.rsplit("/", 1)[-1].removesuffix(".py")

    @property
    def name(self) -> str:
        """The candidate as rows name it: its file name without .py."""
        return self.candidate.rsplit("/", 1)[-1].removesuffix(".py")


def _folder(path: str) -> str:
    return path.strip("/").removeprefix("./") if path.strip("/") not in ("", ".") else ""


def kernel_pairs(names: Iterable[str], problems: str, candidates: str) -> list[KernelPair]:
    """Every (problem, candidate) pair in a job's file names, sorted by problem then candidate. A candidate folder
    with no problem of its name is an error: its candidates would silently go unjudged."""
    problems_dir, candidates_dir = _folder(problems), _folder(candidates)
    found: dict[str, str] = {}
    proposed: dict[str, list[str]] = {}
    for name in names:
        parts = name.split("/")
        if not name.endswith(".py") or parts[-1].startswith("_"):
            continue
        head = "/".join(parts[:-1])
        if head == problems_dir:
            found[parts[-1].removesuffix(".py")] = name
        if candidates_dir and not name.startswith(candidates_dir + "/"):
            continue
        rest = name[len(candidates_dir) + 1:].split("/") if candidates_dir else parts
        if len(rest) == 2:
            proposed.setdefault(rest[0], []).append(name)
    if not found:
        raise SpecError(f"kernel_eval.problems: no problem files (*.py) in {problems!r}")
    orphans = sorted(set(proposed) - set(found))
    if orphans:
        raise SpecError(f"kernel_eval.candidates: folder {orphans[0]!r} matches no problem file ({orphans[0]}.py)")
    pairs = [KernelPair(found[stem], c) for stem in sorted(proposed) for c in sorted(proposed[stem])]
    if not pairs:
        raise SpecError(f"kernel_eval.candidates: no candidates in {candidates!r} (expected <problem>/<name>.py)")
    return pairs


def kernel_shard_ranges(pairs: list[KernelPair], per_shard: int) -> list[tuple[int, int]]:
    """[start, stop) ranges over `pairs`: each holds one problem's candidates (at most `per_shard` of them), so that
    a shard measures its problem's baselines once for all its candidates."""
    ranges: list[tuple[int, int]] = []
    start = 0
    for index in range(1, len(pairs) + 1):
        if index == len(pairs) or pairs[index].problem != pairs[start].problem or index - start >= per_shard:
            ranges.append((start, index))
            start = index
    return ranges


def reward(mode: RewardMode, correct: bool, speedup_vs_eager: float | None, speedup_vs_compile: float | None,
           margin: float = 0.05) -> float:
    """The reward of one candidate. Milestone 3 needs a measured compile time to beat (a compile baseline that failed
    is no milestone)."""
    if mode is RewardMode.SPEEDUP:
        return speedup_vs_eager if correct and speedup_vs_eager is not None else 0.0
    if not correct:
        return -1.0
    beats_eager = speedup_vs_eager is not None and speedup_vs_eager >= 1 + margin
    beats_compile = speedup_vs_compile is not None and speedup_vs_compile >= 1 + margin
    return 3.0 if beats_eager and beats_compile else 2.0 if beats_eager else 1.0


@dataclass(frozen=True)
class KernelResult:
    """One row of a kernel-eval job's results table: one candidate on one problem."""

    problem: str  # the problem's stem
    candidate: str  # the candidate's name (its file name without .py)
    compiled: bool
    correct: bool
    max_abs_err: float | None  # None: never compared
    rel_norm_err: float | None
    median_ms: float | None
    eager_ms: float | None
    compile_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    reward: float
    error: str  # why it is not correct (one line), or ""
    node: str = ""
    device: str = ""
    lowers_precision: bool = False
    # Share of the speed of light (farm.core.speed_of_light): the bound's time over this row's median; the bound used
    # ("compute" or "memory") and the peaks it was computed from, so that a reader can check the arithmetic.
    sol_share: float | None = None
    sol_bound: str = ""
    sol_peaks: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelResult:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


COLUMNS = tuple(KernelResult.__dataclass_fields__)


def speedup(baseline_ms: float | None, candidate_ms: float | None, correct: bool) -> float | None:
    ok = correct and baseline_ms and candidate_ms and math.isfinite(baseline_ms) and candidate_ms > 0
    return baseline_ms / candidate_ms if ok else None  # type: ignore[operator]


@dataclass(frozen=True)
class KernelEvalTask:
    """One shard of a kernel-eval job: one problem's candidates, on one device of one node."""

    job_id: str
    index: int
    pairs: tuple[KernelPair, ...]
    backend: str
    device: str
    reward: RewardMode = RewardMode.SPEEDUP
    margin: float = 0.05
    timeout_s: float = 60.0
    memory_mb: int | None = None
    runs: int = 20
    atol: float = 1e-4
    rtol: float = 1e-4


@dataclass(frozen=True)
class KernelEvalShardResult:
    rows: list[KernelResult] = field(default_factory=list)
    items: int = 0
    seconds: float = 0.0
    correct: int = 0  # rows judged correct
    node_ray_id: str = ""
    energy: Energy | None = None
    peak_memory_bytes: int = 0
    log: str = ""  # what the shard printed (stdout and stderr, bounded): farm_agent.work.capture fills it in
