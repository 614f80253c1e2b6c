"""The hardened evaluator: runs candidate implementations of a problem in child processes and judges them.

A candidate is correct when, on fresh random inputs (several seeds, drawn anew for every evaluation unless given),
its outputs have the reference's shapes and dtypes, are finite and fully written, share no memory with the inputs,
are elementwise close (|out - ref| <= atol + rtol * |ref|) AND close in relative norm (||out - ref|| / ||ref|| <=
max(atol, rtol), which an all-zero or tiny answer fails even where the absolute tolerance alone would pass it).
Its time is the median of `runs` calls after warm-up, caches flushed and the device synchronised around each, and
it is rejected outright when it patches timers, leaves work on other streams or threads, or is faster than the
speed-of-light bound of the problem's FLOPs and bytes on the device.

Children: built-in transforms of one problem share one child (a CUDA start-up costs seconds); a candidate file is
user code and always gets a child of its own. A crash, a hang, an out-of-memory or a CUDA fault fails that
candidate only; the child is restarted for the rest. The speed-of-light bound is computed here, from FLOP and byte
counts reported by the child that ran only built-in code.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import multiprocessing.context
import os
import secrets
import signal
import sys
import tempfile
import threading
import types
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from farm.core.errors import SpecError, UserError
from farm.core.speed_of_light import SpeedOfLight, speed_of_light
from farm_agent.tuner.problem import candidate_defines_model_new, load_problem, one_line

DEFAULT_STARTUP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Candidate:
    """One implementation to evaluate: a built-in transform of the problem's Model, or a file defining ModelNew."""

    name: str  # e.g. "eager", "compile-default", "file:my_kernel"
    file: Path | None = None  # user code defining ModelNew: always runs in a child of its own
    transform: str | None = None  # resolved in the child by farm_agent.tuner.candidates.build (when installed)
    params: dict[str, Any] = field(default_factory=dict)  # JSON-able, passed to the transform
    lowers_precision: bool = False  # TF32, bf16/fp16 autocast ...: reported as such

    def request(self) -> dict[str, Any]:
        return {"name": self.name, "file": str(self.file) if self.file else None, "transform": self.transform,
                "params": self.params, "lowers_precision": self.lowers_precision}


EAGER = Candidate(name="eager", transform="eager")
COMPILE_DEFAULT = Candidate(name="compile-default", transform="compile-default")


def file_candidate(path: Path | str) -> Candidate:
    path = Path(path).expanduser().resolve()
    return Candidate(name=f"file:{path.stem}", file=path)


@dataclass(frozen=True)
class Result:
    """One candidate on one problem."""

    problem: str
    candidate: str
    compiled: bool  # built, and its first call returned
    correct: bool  # sound, and within (atol, rtol) elementwise and in relative norm
    max_abs_err: float  # max |out - ref| over every checked output (inf: never compared)
    rel_norm_err: float  # max over outputs and checks of ||out - ref|| / ||ref||
    max_scaled_err: float  # max |out - ref| / (atol + rtol |ref|) under this evaluation's tolerance: <= 1 passes
    median_ms: float | None  # None: not timed
    runs: int
    error: str  # why it is not correct (one line), or ""
    sound: bool = False  # passed every check that does not depend on the tolerance (shapes, aliasing, timers, ...)
    atol: float = 1e-4  # the tolerance `correct` was judged under
    rtol: float = 1e-4
    # (rtol, max(|out - ref| - rtol |ref|)) pairs: elementwise closeness under any (atol, rtol) is re-judged from
    # these (see correct_under); exact at these rtols, conservative between them.
    excess: tuple[tuple[float, float], ...] = ()
    min_ms: float | None = None
    speed_of_light_ms: float | None = None  # no implementation can be faster on this device
    lowers_precision: bool = False
    # The problem's work as the reference did it (matrix/conv FLOPs; inputs, parameters and outputs in bytes) and the
    # device: what the reports' fp32 speed of light is computed from (farm.core.speed_of_light).
    flops: float | None = None
    bytes: float | None = None
    device_name: str = ""
    # Its energy run (GPU, when asked): back-to-back calls over METER_STEPS of the device's energy counter's steps
    # (farm_agent.tuner.energy); the joules are all the device drew, idle included.
    energy_calls: int = 0
    energy_s: float | None = None
    energy_j: float | None = None
    seconds: float | None = None  # wall time of its evaluation (build, checks, timing, energy), its child's start not

    def speed_of_light(self) -> SpeedOfLight | None:
        """This problem's fp32 speed of light on the device (None: the device's peaks are not recorded)."""
        if self.flops is None or self.bytes is None:
            return None
        return speed_of_light(self.flops, self.bytes, self.device_name)

    def correct_under(self, atol: float, rtol: float) -> bool:
        """Whether this result is correct under another tolerance, from the recorded errors."""
        if not (self.sound and self.compiled) or self.rel_norm_err > max(atol, rtol):
            return False
        return excess_bound(self.excess, rtol) <= atol

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: infinities become None."""
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = None
        data["excess"] = [[r, e if math.isfinite(e) else None] for r, e in self.excess]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        data = dict(data)
        for key in ("max_abs_err", "rel_norm_err", "max_scaled_err"):
            data[key] = math.inf if data.get(key) is None else float(data[key])
        data["excess"] = tuple((float(r), math.inf if e is None else float(e)) for r, e in data.get("excess") or ())
        return cls(**data)


def excess_bound(excess: Sequence[tuple[float, float]], rtol: float) -> float:
    """An upper bound on max(|d| - rtol |ref|) from its values at a few rtols. That function of rtol is a maximum of
    lines, so convex and non-increasing: exact at recorded points, below the chord between two of them, and below
    the value at the nearest recorded point under it."""
    points = sorted(excess)
    if not points or rtol < points[0][0]:
        return math.inf
    for (r0, e0), (r1, e1) in zip(points, points[1:], strict=False):
        if r0 <= rtol <= r1:
            if math.isinf(e0) or math.isinf(e1):
                return e0 if rtol < r1 else e1
            return e0 + (e1 - e0) * (rtol - r0) / (r1 - r0)
    return points[-1][1]


# Peak rates that no implementation can exceed: generous on purpose, since the bound only exists to catch answers
# that did not do the work (a memo, a timer trick), never to judge honest kernels. GPUs: dense FP8 tensor-core
# FLOP/s (above the bf16 989 and fp32 67 TFLOP/s of an H200, so that any precision a candidate picks stays under
# it) and HBM bandwidth (the timed runs start with a flushed L2, so inputs come from HBM).
GPU_PEAKS: dict[str, tuple[float, float]] = {  # name fragment: (FLOP/s, bytes/s)
    "H200": (1979e12, 4.8e12),
    "H100": (1979e12, 3.35e12),
    "A100": (624e12, 2.04e12),
}
UNKNOWN_GPU_PEAK = (10e15, 10e12)
# Per CPU core: AMX-class matrix units (~1k FLOP/cycle at 4 GHz, far above fp32 AVX-512) and what a core's caches
# can stream.
CPU_CORE_PEAK = (4e12, 200e9)


def peaks(info: dict[str, Any]) -> tuple[float, float]:
    if info["device"] == "cuda":
        return next((p for name, p in GPU_PEAKS.items() if name in info["device_name"]), UNKNOWN_GPU_PEAK)
    cores = max(int(info.get("cpus") or 1), 1)
    return CPU_CORE_PEAK[0] * cores, CPU_CORE_PEAK[1] * cores


def speed_of_light_ms(info: dict[str, Any], peak_flops_per_s: float | None = None,
                      peak_bytes_per_s: float | None = None) -> float:
    flops_rate, bytes_rate = peaks(info)
    flops_rate, bytes_rate = peak_flops_per_s or flops_rate, peak_bytes_per_s or bytes_rate
    return max(info["flops"] / flops_rate, info["bytes"] / bytes_rate) * 1e3


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def evaluate(
    problem: Path | str,
    candidates: Sequence[Candidate],
    *,
    device: str = "cuda",
    atol: float = 1e-4,
    rtol: float = 1e-4,
    seeds: Sequence[int] | None = None,
    runs: int = 20,
    warmup: int = 3,
    timeout_s: float = 600.0,
    memory_limit_bytes: int | None = None,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    flush_bytes: int | None = None,
    peak_flops_per_s: float | None = None,
    peak_bytes_per_s: float | None = None,
    parallel: int = 1,
    energy: bool = False,
    deadline: float | None = None,
) -> list[Result]:
    """Evaluate `candidates` on one problem; "eager" (the baseline) is always evaluated, first. Returns one Result
    per candidate, eager first, then in the order given.

    seeds: the correctness checks' input seeds; None draws three fresh ones (a candidate cannot know its inputs in
    advance). timeout_s: per candidate, from its request to its answer (builds and compiles included).
    memory_limit_bytes: on CUDA the child's share of GPU memory; on CPU the child's resident memory. flush_bytes:
    written between timed runs (default 256 MiB on a GPU, 8 MiB on a CPU: more than its L2). peak_*: override the
    device's peak rates in the speed-of-light bound. parallel: how many candidate files are evaluated at once, each
    in its own child; above 1 their timings disturb one another, so only for screening correctness (the tests do).
    energy: also read each candidate's energy per call on the GPU's energy counter (Result.energy_*), ~2 s each.
    deadline: a time.monotonic() past which no candidate after eager is asked for, and one still running is stopped
    (a tuning budget: each is reported not measured, and why).
    """
    with Evaluation(problem, device=device, atol=atol, rtol=rtol, seeds=seeds, runs=runs, warmup=warmup,
                    timeout_s=timeout_s, memory_limit_bytes=memory_limit_bytes, startup_timeout_s=startup_timeout_s,
                    flush_bytes=flush_bytes, peak_flops_per_s=peak_flops_per_s, peak_bytes_per_s=peak_bytes_per_s,
                    parallel=parallel, energy=energy) as evaluation:
        return evaluation.run(candidates, deadline=deadline)


class Evaluation:
    """One problem's evaluations over several calls of `run` (a tuning run's rounds): its built-in transforms share
    one child for all of them, and eager (the reference) is measured once, in the first. A child's start (a CUDA
    context, the model, the reference's FLOPs) and eager's checks and timing cost seconds a round: a job's tuning
    run on an H100 spent its whole 20 s budget on them. Arguments as evaluate's."""

    def __init__(self, problem: Path | str, *, device: str = "cuda", atol: float = 1e-4, rtol: float = 1e-4,
                 seeds: Sequence[int] | None = None, runs: int = 20, warmup: int = 3, timeout_s: float = 600.0,
                 memory_limit_bytes: int | None = None, startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                 flush_bytes: int | None = None, peak_flops_per_s: float | None = None,
                 peak_bytes_per_s: float | None = None, parallel: int = 1, energy: bool = False) -> None:
        self.problem = load_problem(problem)
        if device.startswith("cuda") and not cuda_available():
            raise UserError("--device cuda: no CUDA GPU is available here (use --device cpu)")
        if runs < 1 or warmup < 0:
            raise UserError("runs must be at least 1 and warmup at least 0")
        seeds = list(seeds) if seeds is not None else [secrets.randbits(31) for _ in range(3)]
        if not seeds:
            raise UserError("at least one seed is needed")
        self.setup = {
            "op": "setup", "problem": str(self.problem.path), "device": device, "seeds": seeds,
            "timing_seeds": [max(seeds) + 1, max(seeds) + 2], "runs": runs, "warmup": warmup, "atol": atol,
            "rtol": rtol, "memory_limit_bytes": memory_limit_bytes, "energy": energy,
            "flush_bytes": flush_bytes or (256 << 20 if device.startswith("cuda") else 8 << 20),
        }
        self.atol, self.rtol, self.timeout_s, self.parallel = atol, rtol, timeout_s, parallel
        self.startup_timeout_s, self.memory_limit_bytes = startup_timeout_s, memory_limit_bytes
        self.peaks = (peak_flops_per_s, peak_bytes_per_s)
        self.transforms = _Group(self.problem.name, self.setup, timeout_s, startup_timeout_s, memory_limit_bytes)
        self.eager: tuple[Candidate, dict[str, Any]] | None = None  # the reference, measured by the first run

    def __enter__(self) -> Evaluation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.transforms.close()

    @property
    def start_s(self) -> float:
        """Seconds spent starting the transforms' child (and restarting it after a candidate broke it)."""
        return self.transforms.start_s

    def run(self, candidates: Sequence[Candidate], deadline: float | None = None) -> list[Result]:
        """Evaluate `candidates` (eager first, measured in the first run only and returned with every run's)."""
        for candidate in candidates:
            if (candidate.file is None) == (candidate.transform is None):
                raise UserError(f"candidate {candidate.name!r} needs exactly one of a file and a transform")
            if candidate.file is not None:
                candidate_defines_model_new(candidate.file)
        if len({c.name for c in candidates}) != len(candidates):
            raise UserError("candidate names must be unique")
        given_eager = next((c for c in candidates if c.transform == "eager"), None)
        raw: dict[str, dict[str, Any]] = {}
        if self.eager is None:  # the baseline, given or not: the reference every later candidate is judged by
            eager = given_eager or EAGER
            self.transforms.run([eager], raw, None)
            if self.transforms.info is None:  # the problem itself does not run: nothing can be judged
                raise SpecError(f"problem {self.problem.name}: {raw[eager.name]['error']}")
            self.eager = (eager, raw[eager.name])
        eager, raw[self.eager[0].name] = self.eager[0], self.eager[1]
        rest = [c for c in candidates if c is not given_eager and c.name != eager.name]
        self.transforms.run([c for c in rest if c.file is None], raw, deadline)
        files = [c for c in rest if c.file is not None]
        with ThreadPoolExecutor(max_workers=max(self.parallel, 1)) as pool:  # threads only wait on children here
            list(pool.map(lambda c: _Group(self.problem.name, self.setup, self.timeout_s, self.startup_timeout_s,
                                           self.memory_limit_bytes).run_once([c], raw), files))
        trusted = self.transforms.info
        assert trusted is not None
        sol_ms = speed_of_light_ms(trusted, *self.peaks)
        return [_judge(raw[c.name], c, self.atol, self.rtol, sol_ms, trusted) for c in [eager, *rest]]


def _judge(data: dict[str, Any], candidate: Candidate, atol: float, rtol: float, sol_ms: float,
           info: dict[str, Any]) -> Result:
    data = {k: v for k, v in data.items() if k in Result.__dataclass_fields__}
    result = Result.from_dict({**dict(
        max_abs_err=None, rel_norm_err=None, max_scaled_err=None, median_ms=None, runs=0, compiled=False,
        sound=False, error="",
    ), **data, "correct": False, "atol": atol, "rtol": rtol, "speed_of_light_ms": sol_ms,
        "lowers_precision": candidate.lowers_precision, "flops": float(info["flops"]),
        "bytes": float(info["bytes"] + info.get("param_bytes", 0)), "device_name": str(info["device_name"])})
    error, sound = result.error, result.sound
    if sound and result.median_ms is not None and result.median_ms < sol_ms:
        sound = False
        error = (f"rejected: faster than the speed of light ({result.median_ms:.4f} ms < {sol_ms:.4f} ms for "
                 f"{info['flops']:.3g} FLOP and {info['bytes']:.3g} bytes on {info['device_name']})")
    result = replace(result, sound=sound, error=error)
    correct = result.correct_under(atol, rtol)
    if sound and not correct:
        if result.rel_norm_err > max(atol, rtol):
            error = f"incorrect: relative norm error {result.rel_norm_err:.3g} > {max(atol, rtol):g}"
        else:
            error = f"incorrect: max |out - ref| / (atol + rtol |ref|) = {result.max_scaled_err:.3g} > 1"
    return replace(result, correct=correct, error=error)


class _Group:
    """Candidates run one after another in one child, a fresh child started after any that broke it. `info` is the
    setup answer of the first child that started (None while none could)."""

    def __init__(self, problem: str, setup: dict[str, Any], timeout_s: float, startup_timeout_s: float,
                 memory_limit_bytes: int | None) -> None:
        self.problem, self.setup, self.timeout_s, self.startup_timeout_s = problem, setup, timeout_s, startup_timeout_s
        self.limit = memory_limit_bytes if not str(setup["device"]).startswith("cuda") else None
        self.child: Child | None = None
        self.info: dict[str, Any] | None = None
        self.start_s = 0.0

    def run_once(self, group: list[Candidate], raw: dict[str, dict[str, Any]]) -> None:
        try:
            self.run(group, raw, None)
        finally:
            self.close()

    def run(self, group: list[Candidate], raw: dict[str, dict[str, Any]], deadline: float | None) -> None:
        """Each candidate's raw answer into `raw`, with the seconds its evaluation took (`seconds`); past
        `deadline` (time.monotonic()), none is asked for and one still running is stopped."""
        for index, candidate in enumerate(group):
            wait = self.timeout_s
            if deadline is not None:
                wait = min(self.timeout_s, deadline - time.monotonic())
                if wait <= 0:
                    raw[candidate.name] = {**_failure(self.problem, candidate, OUT_OF_BUDGET), "seconds": 0.0}
                    continue
            if self.child is None:
                began = time.perf_counter()
                self.child = Child(self.limit)
                try:
                    answer = self.child.ask(self.setup, self.startup_timeout_s)
                except ChildFailed as exc:
                    raw[candidate.name] = _failure(self.problem, candidate, f"worker did not start: {exc}")
                    self.close()
                    if self.info is None:
                        return
                    continue
                finally:
                    self.start_s += time.perf_counter() - began
                if not answer.get("ok"):  # the problem's own setup failed: so it would for every one left
                    for left in group[index:]:
                        raw[left.name] = _failure(self.problem, left, answer.get("error", "setup failed"))
                    self.close()
                    return
                self.info = self.info or answer["info"]
            began = time.perf_counter()
            try:
                answer = self.child.ask({"op": "candidate", "candidate": candidate.request()}, wait)
                raw[candidate.name] = {**answer["result"], "seconds": time.perf_counter() - began}
                if answer.get("restart"):
                    self.close()
            except ChildFailed as exc:
                cut = exc.timed_out and wait < self.timeout_s  # by the budget, not by its own timeout
                raw[candidate.name] = {**_failure(self.problem, candidate, OUT_OF_BUDGET if cut else str(exc),
                                                  compiled=exc.compiled), "seconds": time.perf_counter() - began}
                self.close()

    def close(self) -> None:
        if self.child is not None:
            self.child.close()
        self.child = None


OUT_OF_BUDGET = "not measured: the tuning budget ran out"


def _failure(problem: str, candidate: Candidate, error: str, compiled: bool = False) -> dict[str, Any]:
    return {"problem": problem, "candidate": candidate.name, "compiled": compiled, "sound": False, "error": error}


class ChildFailed(Exception):
    def __init__(self, message: str, compiled: bool = False, timed_out: bool = False) -> None:
        super().__init__(message)
        self.compiled = compiled
        self.timed_out = timed_out


_STARTING = threading.Lock()


def _context() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    # Imported once by the fork server, not by every child (torch alone takes seconds). The fork server must never
    # initialise the CUDA driver, or its forked children could not use CUDA: should anything it imports ask whether
    # CUDA is available, PyTorch answers through NVML instead (the server inherits this environment when it starts).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    context.set_forkserver_preload(["torch", "farm_agent.tuner.worker"])
    return context


class Child:
    """A worker process: JSON requests and answers over a pipe, its output in a log file whose last line explains
    a crash. It leads its own session, so that it and any compiler processes it started are killed together."""

    def __init__(self, memory_limit_bytes: int | None) -> None:
        from farm_agent.tuner.worker import child_main

        context = _context()
        log = tempfile.NamedTemporaryFile(prefix="farm-kernel-worker-", suffix=".log", delete=False)
        log.close()
        self.log = Path(log.name)
        self.conn, child_end = context.Pipe()
        self.proc = context.Process(target=child_main, args=(child_end, str(self.log), os.getpid()),
                                    name="farm-kernel-worker")
        with _STARTING:
            # multiprocessing re-imports the caller's __main__ in a new process (as spawn does), which would re-run
            # a script without an `if __name__ == "__main__"` guard: the child needs nothing from it, so it is shown
            # an empty __main__ while it starts.
            main = sys.modules["__main__"]
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                self.proc.start()
            finally:
                sys.modules["__main__"] = main
        child_end.close()
        self.memory_limit_bytes = memory_limit_bytes

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        try:
            self.conn.send_bytes(json.dumps(request).encode())
        except OSError:
            raise ChildFailed(self.death()) from None
        deadline = time.monotonic() + timeout_s
        while not self.conn.poll(0.1):
            if not self.proc.is_alive():
                raise ChildFailed(self.death(), compiled=True)
            if time.monotonic() > deadline:
                self.kill()
                raise ChildFailed(f"timed out after {timeout_s:g} s", compiled=True, timed_out=True)
            if self.memory_limit_bytes and self.rss() > self.memory_limit_bytes:
                self.kill()
                raise ChildFailed(f"used more than {self.memory_limit_bytes / 2**20:.0f} MiB of memory", compiled=True)
        try:
            return json.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise ChildFailed(self.death(), compiled=True) from None

    def rss(self) -> int:
        import psutil  # only where a CPU memory limit is watched

        try:
            return psutil.Process(self.proc.pid).memory_info().rss
        except psutil.Error:
            return 0

    def death(self) -> str:
        self.proc.join(timeout=10)
        if self.proc.exitcode is None:
            self.kill()
        code = self.proc.exitcode or 0
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        tail = [line for line in text.splitlines() if line.strip()][-1:]
        return f"worker process died ({how})" + (f": {one_line(tail[0])}" if tail else "")

    def kill(self) -> None:
        if self.proc.pid is not None:
            try:  # the child's session: it and what it started
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.join()

    def close(self) -> None:
        if self.conn.closed:
            return
        self.conn.close()  # end of requests: the worker returns
        self.proc.join(timeout=30)
        self.kill()
        self.proc.close()
        self.log.unlink(missing_ok=True)
