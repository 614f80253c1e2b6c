"""The evaluator's child process: runs candidates against a problem's reference and measures them.

The parent (evaluator.Child) starts `child_main` in a process of its own and sends JSON requests over a pipe;
whatever a candidate prints goes to a log file, never into the pipe. Requests:

    {"op": "setup", "problem": PATH, "device": "cuda"|"cpu"|..., "seeds": [...], "timing_seeds": [a, b],
     "runs": N, "warmup": W, "atol": A, "rtol": R, "flush_bytes": B, "memory_limit_bytes": M|null}
        -> {"ok": true, "info": {device facts, flops, bytes, outputs}}  or  {"ok": false, "error": "..."}
    {"op": "candidate", "candidate": {"name", "file", "transform", "params", "lowers_precision"}}
        -> {"ok": true, "result": {...}, "restart": bool}   (restart: the CUDA context is broken, start a new child)

The candidate runs in this process, so this is not a sandbox against code that sets out to rewrite the worker's
memory; what it does is make the known ways of gaming a timing reward fail loudly (each has a cheating candidate in
tests/fixtures/kernels/), while the parent judges the speed-of-light bound from a child that ran no user code.
"""

from __future__ import annotations

import builtins
import gc
import importlib.util
import json
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import thread as futures_thread
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

# Imported up front, in the fork server, once: FlopCounterMode (farm_agent.tuner.flops) needs dynamo (seconds to
# import) and torch.compile needs inductor; importing them in every child would cost each child those seconds.
import torch._dynamo  # noqa: F401
import torch._inductor  # noqa: F401
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.compile_worker.subproc_pool import SubprocPool
from torch._inductor.compile_worker.timer import Timer as InductorTimer

from farm_agent.tuner.energy import EnergyRun, open_meter
from farm_agent.tuner.energy import measure as measure_energy
from farm_agent.tuner.flops import flop_counter
from farm_agent.tuner.problem import MODEL_SEED, Problem, import_candidate, load_problem, one_line

# The worker's own references to what it times and checks with, taken before any candidate code runs: a candidate
# that rebinds time.perf_counter or torch.cuda.Event changes the module attribute, not these (and is rejected for
# trying: see guarded_callables).
_perf_counter = time.perf_counter
_sleep = time.sleep
_enumerate_threads = threading.enumerate
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed_time = torch.cuda.Event.elapsed_time
_synchronize = torch.cuda.synchronize
_current_stream = torch.cuda.current_stream
_equal = torch.equal
_isfinite = torch.isfinite
_vector_norm = torch.linalg.vector_norm

# The rtol values at which the worst absolute excess max(|out - ref| - rtol * |ref|) is recorded, so that a result
# can be re-judged under another tolerance without re-running (Result.correct_under in the evaluator).
RTOL_GRID = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def threads_now() -> set[threading.Thread]:
    return set(_enumerate_threads())


def _allowed_thread_classes() -> tuple[type, ...]:
    # tqdm's progress-bar monitor: torch.compile's progress bars start it on a first compile.
    if importlib.util.find_spec("tqdm") is None:
        return ()
    from tqdm._monitor import TMonitor

    return (TMonitor,)


_ALLOWED_THREADS = _allowed_thread_classes()

# Inductor's compile pools start threads of their own (torch.compile inside a candidate, or the compile-default
# baseline) that outlive the call that started them: the subprocess pool's reader and its quiesce timer
# ("subproc_worker_timer"), and the thread pool's workers (below). A thread's name proves nothing (anyone can name a
# thread so), so a thread is Inductor's only when it is a
# plain Thread whose target is one of these functions, as taken here before any candidate ran, bound to an object of
# exactly Inductor's class; and the timer's callback must itself be the pool's quiesce. Such a thread can only run
# Inductor's own code, never a candidate's work.
_TIMER_CHECK = InductorTimer.check
_POOL_READ = SubprocPool._read_thread
_POOL_QUIESCE = SubprocPool.quiesce
# Inductor's compile thread pool (AsyncCompile.pool, an lru_cache of one ThreadPoolExecutor): its worker threads
# outlive the compile. Anyone can submit work to that pool, so one of its threads is allowed only while idle: its
# stack is not inside a work item and the pool's queue is empty (no work left running or waiting).
_ASYNC_POOL = AsyncCompile.pool
_POOL_WORKER = futures_thread._worker
_WORK_ITEM_RUN = futures_thread._WorkItem.run.__code__
_current_frames = sys._current_frames


def _inductor_executor() -> ThreadPoolExecutor | None:
    return _ASYNC_POOL() if _ASYNC_POOL.cache_info().currsize else None  # never creates it


def _idle_worker(thread: threading.Thread, executor: ThreadPoolExecutor) -> bool:
    frame = _current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code is _WORK_ITEM_RUN:
            return False
        frame = frame.f_back
    return executor._work_queue.empty()


def _bound(method: object, function: object, owner: type) -> bool:
    return getattr(method, "__func__", None) is function and type(getattr(method, "__self__", None)) is owner


def is_inductor_thread(thread: threading.Thread) -> bool:
    if type(thread) is not threading.Thread:
        return False
    target = getattr(thread, "_target", None)  # CPython keeps it while the thread runs
    if _bound(target, _POOL_READ, SubprocPool):
        return True
    if target is _POOL_WORKER:
        args = getattr(thread, "_args", ())
        executor = args[0]() if args else None  # the worker holds a weak reference to its executor
        return executor is _inductor_executor() and executor is not None and _idle_worker(thread, executor)
    timer = getattr(target, "__self__", None)
    return _bound(target, _TIMER_CHECK, InductorTimer) and _bound(getattr(timer, "call", None), _POOL_QUIESCE,
                                                                   SubprocPool)


def new_threads(before: set[threading.Thread]) -> list[str]:
    """Threads alive now that were not before (a compiler's progress-bar monitor and Inductor's compile-pool threads
    apart)."""
    return sorted(t.name for t in _enumerate_threads()
                  if t not in before and type(t) not in _ALLOWED_THREADS and not is_inductor_thread(t))


class Rejected(Exception):
    """The candidate broke a rule that no tolerance can forgive (wrong shape, aliasing, timer patching, ...)."""


# -- guards -------------------------------------------------------------------------------------------------------


def guarded_callables(problem: Problem) -> dict[str, object]:
    """Every function and class of the modules that timing and checking rely on, by name. Compared by identity
    before and after candidate code runs: a candidate that rebinds any of them (time.perf_counter,
    torch.cuda.Event.elapsed_time, torch.Tensor.sub, this worker's own functions, the problem's get_inputs or
    Model.forward, ...) is rejected."""
    owners: list[tuple[str, Any]] = [
        ("time", time), ("threading", threading), ("os", os), ("json", json), ("builtins", builtins),
        ("math", math), ("statistics", statistics), ("torch", torch), ("torch.Tensor", torch.Tensor),
        ("torch._C.TensorBase", torch._C.TensorBase), ("torch.cuda", torch.cuda),
        ("torch.cuda.Event", torch.cuda.Event),
        ("torch.cuda.Stream", torch.cuda.Stream), ("torch.linalg", torch.linalg), ("torch.nn.Module", torch.nn.Module),
        ("worker", sys.modules[__name__]), ("farm_agent.tuner.problem", sys.modules[Problem.__module__]),
        ("Problem", Problem), ("problem", problem.module), ("Model", problem.module.Model),
        ("InductorTimer", InductorTimer), ("SubprocPool", SubprocPool),
    ]
    found: dict[str, object] = {}
    for label, owner in owners:
        for key, value in list(vars(owner).items()):
            if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                found[f"{label}.{key}"] = value
    return found


# Rebound by torch itself. Importing torch._dynamo wraps torch.manual_seed; torch.compile's first compile patches
# nn.Module's __init__ and __setstate__ to track module creation (the reference model already exists by then).
REWRAPPED_BY_TORCH = frozenset({"torch.manual_seed"})
REBOUND_BY_TORCH = frozenset({"torch.nn.Module.__init__", "torch.nn.Module.__setstate__"})


def check_unpatched(before: dict[str, object], problem: Problem) -> None:
    after = guarded_callables(problem)
    changed = sorted(
        name for name, value in before.items()
        if after.get(name) is not value and name not in REBOUND_BY_TORCH
        and not (name in REWRAPPED_BY_TORCH and getattr(after.get(name), "__wrapped__", None) is value)
    )
    if changed:
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise Rejected(f"patched {', '.join(changed[:3])}{more}: timers and checks must not be replaced")


# -- tensors ------------------------------------------------------------------------------------------------------


def tensors_of(value: Any, what: str) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    raise Rejected(f"{what} returned {type(value).__name__}, not a tensor or a tuple of tensors")


def clone_all(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def poison(values: list[Any]) -> None:
    """Overwrite tensors the worker is about to drop, so that memory the allocator hands out again (to a candidate's
    torch.empty) holds NaN (or an extreme integer), never a correct answer from an earlier check."""
    for value in values:
        if isinstance(value, torch.Tensor) and value.numel() and not value.is_inference():
            if value.is_floating_point() or value.is_complex():
                value.fill_(math.nan)
            elif value.dtype == torch.bool:
                value.fill_(True)
            else:
                value.fill_(torch.iinfo(value.dtype).max)


def fingerprint(module: torch.nn.Module) -> list[tuple[str, float, float]]:
    """Each parameter's and buffer's sum and sum of squares, in float64."""
    with torch.no_grad():
        return [(name, float(t.double().sum()), float(t.double().square().sum()))
                for name, t in module.state_dict(keep_vars=True).items() if isinstance(t, torch.Tensor)]


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or not a.untyped_storage().nbytes() or not b.untyped_storage().nbytes():
        return False
    (a0, a1), (b0, b1) = storage_span(a), storage_span(b)
    return a0 < b1 and b0 < a1


def nbytes(values: list[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


@contextmanager
def strict_precision() -> Iterator[None]:
    """The reference always runs in full fp32, whatever global flags a candidate (TF32, autocast) left behind."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])


def precision_flags(lowers_precision: bool) -> None:
    """The global precision flags a candidate starts from. PyTorch's own defaults let cuDNN convolutions use TF32
    (torch.backends.cudnn.allow_tf32 is True): the eager baseline, and any candidate that does not declare that it
    lowers precision, runs in full fp32 instead, so that a fp32 candidate is not timed against a TF32 baseline. One
    that lowers precision starts from PyTorch's defaults (and sets what it needs itself)."""
    torch.backends.cudnn.allow_tf32 = lowers_precision
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default as well
    torch.set_float32_matmul_precision("highest")


class Errors:
    """The worst errors seen over every check of one candidate."""

    def __init__(self, atol: float, rtol: float) -> None:
        self.atol, self.rtol = atol, rtol
        self.max_abs = 0.0
        self.rel_norm = 0.0
        self.max_scaled = 0.0
        self.excess = {r: -math.inf for r in RTOL_GRID + (rtol,)}
        self.compared = False  # whether any output was compared yet

    def add(self, outs: list[torch.Tensor], refs: list[torch.Tensor]) -> None:
        for out, ref in zip(outs, refs, strict=True):
            o = out if out.is_floating_point() else out.double()
            r = ref if ref.is_floating_point() else ref.double()
            diff = (o - r).abs()
            size = r.abs()
            self.max_abs = max(self.max_abs, float(diff.max()))
            self.max_scaled = max(self.max_scaled, float((diff / (self.atol + self.rtol * size)).max()))
            for rtol in self.excess:
                self.excess[rtol] = max(self.excess[rtol], float((diff - rtol * size).max()))
            # Each output on its own, so that a small output cannot hide inside a large one; a zero reference with a
            # non-zero answer is infinitely wrong, a zero answer to it exactly right.
            ref_norm = float(_vector_norm(r, dtype=torch.float64))
            err_norm = float(_vector_norm(diff, dtype=torch.float64))
            self.rel_norm = max(self.rel_norm, err_norm / ref_norm if ref_norm else (math.inf if err_norm else 0.0))
            del diff, size
        self.compared = True

    def record(self) -> dict[str, Any]:
        return {"max_abs_err": self.max_abs, "rel_norm_err": self.rel_norm, "max_scaled_err": self.max_scaled,
                "excess": sorted([r, e] for r, e in self.excess.items())}


# -- the session --------------------------------------------------------------------------------------------------


class Session:
    """One problem on one device; evaluates candidates one after another."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.problem: Problem = load_problem(request["problem"])
        self.device = torch.device(request["device"])
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:  # "cuda" means the current GPU: name it, as tensors do
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.seeds: list[int] = list(request["seeds"])
        self.timing_seeds: list[int] = list(request["timing_seeds"])
        self.runs: int = int(request["runs"])
        self.warmup: int = int(request["warmup"])
        self.atol, self.rtol = float(request["atol"]), float(request["rtol"])
        if self.cuda:
            torch.cuda.set_device(self.device)
            limit = request.get("memory_limit_bytes")
            if limit:
                total = torch.cuda.get_device_properties(self.device).total_memory
                torch.cuda.set_per_process_memory_fraction(min(limit / total, 1.0), self.device)
            # Captured before any candidate runs: timed work must run on this stream (see call).
            self.stream = _current_stream(self.device)
        # Written between timed runs: larger than the GPU's L2 (50 MB on an H200) or a CPU's last-level cache, so
        # that every timed run starts with cold caches, as one forward among others in a real job would.
        self.flush = torch.empty(int(request["flush_bytes"]) // 4, dtype=torch.float32, device=self.device)
        # The device's energy counter, where the caller ranks by joules (farm_agent.tuner.energy): GPUs only.
        self.meter = open_meter(self.device) if self.cuda and request.get("energy") else None
        self.reference = self.problem.model(self.device)
        self.reference_fingerprint = fingerprint(self.reference)
        self.outputs: list[tuple[list[int], torch.dtype]] = []

    def setup(self) -> dict[str, Any]:
        """Run the reference once on a probe input: its FLOPs, its bytes and its outputs' shapes."""
        inputs = self.problem.inputs(self.device, seed=max(self.timing_seeds) + 1)
        for i, value in enumerate(inputs):
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(value.ne(0).any()):
                raise ValueError(f"get_inputs()[{i}] is all zeros: inputs must be random, never zeros")
        with torch.no_grad(), strict_precision(), flop_counter() as counter:
            out = tensors_of(self.reference(*inputs), "Model")
        self.sync()
        for i, t in enumerate(out):
            if not bool(_isfinite(t).all()):
                raise ValueError(f"the reference's output {i} has NaN or Inf")
        self.outputs = [(list(t.shape), t.dtype) for t in out]
        info = {
            "device": self.device.type, "device_name": self.device_name(), "cpus": len(os.sched_getaffinity(0)),
            "flops": int(counter.get_total_flops()), "bytes": nbytes(inputs) + nbytes(out),
            # the model's parameters and buffers, read once: in the reports' speed of light, not in the rejection
            # bound above (kept as it was, the weakest claim)
            "param_bytes": nbytes([*self.reference.parameters(), *self.reference.buffers()]),
            "outputs": [{"shape": s, "dtype": str(d)} for s, d in self.outputs],
            "torch": torch.__version__,
        }
        poison(out + inputs)
        return info

    def check_untouched(self, guard: dict[str, object] | None) -> None:
        """Nothing the checks rely on was replaced (guard: None for built-in transforms, whose compilers may rebind
        torch internals), and the reference model still has the weights it was built with (a candidate can reach it
        through the garbage collector: zeroed weights would make zeros look right)."""
        if guard is not None:
            check_unpatched(guard, self.problem)
        if fingerprint(self.reference) != self.reference_fingerprint:
            raise Rejected("modified the reference model's parameters or buffers")

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.cuda else "cpu"

    def sync(self) -> None:
        if self.cuda:
            _synchronize(self.device)

    def reference_outputs(self, inputs: list[Any]) -> list[torch.Tensor]:
        with strict_precision():
            refs = tensors_of(self.reference(*inputs), "Model")
        self.sync()
        return [r.clone() for r in refs]  # the reference may hand back a buffer it reuses

    # -- building -----------------------------------------------------------------------------------------------

    def build(self, candidate: dict[str, Any], guard: dict[str, object]) -> Callable[..., Any]:
        if candidate.get("file"):
            threads = threads_now()
            model_new = import_candidate(Path(candidate["file"]))
            with torch.device(self.device):
                torch.manual_seed(MODEL_SEED)  # the seed Model was built under: same layers, same initial weights
                module = model_new(*self.problem.init_inputs())
            module = module.to(self.device).eval()
            if started := new_threads(threads):
                raise Rejected(f"started thread {started[0]!r} while importing or constructing (work must run on "
                               "the caller's thread)")
            check_unpatched(guard, self.problem)
            return module
        transform = candidate["transform"]
        model = self.problem.model(self.device)
        if transform == "eager":
            return model
        if importlib.util.find_spec("farm_agent.tuner.candidates") is not None:
            from farm_agent.tuner import candidates  # the optimizer's transforms, when they are installed

            example = self.problem.inputs(self.device, seed=max(self.timing_seeds) + 2)
            return candidates.build(transform, model, example, dict(candidate.get("params") or {}))
        if transform == "compile-default":
            return torch.compile(model)
        raise Rejected(f"unknown transform {transform!r}")

    # -- one call -----------------------------------------------------------------------------------------------

    def call(self, fn: Callable[..., Any], inputs: list[Any], check_threads: bool
             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One call with the checks that need no reference: returns its outputs and a copy of them taken as soon as
        the call's own stream (GPU) or the call itself (CPU) finished."""
        if self.cuda and _current_stream(self.device) != self.stream:
            raise Rejected("changed the current CUDA stream")
        threads = threads_now()
        outs = tensors_of(fn(*inputs), "forward")
        if check_threads and (started := new_threads(threads)):
            raise Rejected(f"left thread {started[0]!r} running after its forward returned (work must finish on the "
                           "caller's thread)")
        if self.cuda:
            if _current_stream(self.device) != self.stream:
                raise Rejected("changed the current CUDA stream")
            self.stream.synchronize()
        early = [o.clone() for o in outs]
        self.sync()
        return outs, early

    def check_outputs(self, outs: list[torch.Tensor], early: list[torch.Tensor], given: list[Any]) -> None:
        if len(outs) != len(self.outputs):
            raise Rejected(f"returned {len(outs)} outputs, the reference returns {len(self.outputs)}")
        for i, (out, (shape, dtype)) in enumerate(zip(outs, self.outputs, strict=True)):
            if list(out.shape) != shape or out.dtype != dtype:
                raise Rejected(f"output {i} is {out.dtype} {tuple(out.shape)}, "
                               f"the reference's is {dtype} {tuple(shape)}")
            if out.device != self.device:
                raise Rejected(f"output {i} is on {out.device}, not {self.device}")
            # An output sharing memory with an input is the input (or a view of it) handed back, or the input
            # overwritten in place: neither is a new result.
            if any(isinstance(v, torch.Tensor) and overlaps(out, v) for v in given):
                raise Rejected(f"output {i} aliases an input (shares its memory)")
        for i, (out, first) in enumerate(zip(outs, early, strict=True)):
            # Uninitialised memory (torch.empty) reads as the NaN the worker poisoned it with; an output written by
            # work still running on another stream or thread changes after the call returned.
            if not bool(_isfinite(first).all()):
                raise Rejected(f"output {i} has NaN or Inf (not fully written, or overflowed)")
            if not _equal(out, first):
                raise Rejected(f"output {i} changed after the call returned (work left running on another stream "
                               "or thread)")

    def poison_fresh_outputs(self) -> None:
        """Allocate and drop NaN tensors of the outputs' sizes right before a checked call: a candidate that
        returns torch.empty of that size gets this memory back from the allocator and returns NaN."""
        bait = [torch.full(shape, math.nan, dtype=dtype, device=self.device) if dtype.is_floating_point
                else torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in self.outputs]
        poison(bait)
        del bait

    # -- one candidate ------------------------------------------------------------------------------------------

    def evaluate(self, candidate: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = {
            "problem": self.problem.name, "candidate": candidate["name"], "compiled": False, "sound": False,
            "max_abs_err": math.inf, "rel_norm_err": math.inf, "max_scaled_err": math.inf, "excess": [],
            "median_ms": None, "min_ms": None, "runs": 0, "error": "",
        }
        precision_flags(lowers_precision=bool(candidate.get("lowers_precision")))
        guard = guarded_callables(self.problem)
        errors = Errors(self.atol, self.rtol)
        try:
            with torch.no_grad():
                try:
                    fn = self.build(candidate, guard)
                except Rejected:
                    raise
                except Exception as exc:
                    result["error"] = f"build failed: {describe(exc)}"
                    return result
                # Built-in transforms are Farm's own code: their compilers may start helper threads on a first call
                # and rebind torch internals. User code may do neither.
                trusted = not candidate.get("file")
                self.check_correctness(fn, errors, result, trusted=trusted)
                self.check_untouched(None if trusted else guard)
                times = self.time(fn, errors)
                self.check_untouched(None if trusted else guard)
                run = self.energy_run(fn, statistics.median(times))
                self.check_untouched(None if trusted else guard)
            result.update(errors.record())
            result.update(sound=True, median_ms=statistics.median(times), min_ms=min(times), runs=len(times))
            if run is not None:
                result.update(energy_calls=run.calls, energy_s=run.seconds, energy_j=run.joules)
        except Rejected as exc:
            if errors.compared:
                result.update(errors.record())
            result["error"] = f"rejected: {exc}"
        except Exception as exc:
            result["error"] = f"failed: {describe(exc)}"
            if is_cuda_fault(exc):
                raise
        finally:
            fn = None  # type: ignore[assignment]  # noqa: F841 (drop the candidate before the next one is built)
            if "torch._dynamo" in sys.modules:  # free compiled graphs (and what they hold) of this candidate
                torch._dynamo.reset()
            gc.collect()
            if self.cuda:
                torch.cuda.empty_cache()
        return result

    def check_correctness(self, fn: Callable[..., Any], errors: Errors, result: dict[str, Any], trusted: bool) -> None:
        """One call per seed, each on fresh random inputs; the reference for a seed is computed only after the
        candidate answered it, so that no correct answer sits anywhere in memory while the candidate runs."""
        for i, seed in enumerate(self.seeds):
            pristine = self.problem.inputs(self.device, seed)
            given = clone_all(pristine)
            self.poison_fresh_outputs()
            outs, early = self.call(fn, given, check_threads=i > 0 or not trusted)
            result["compiled"] = True
            self.check_outputs(outs, early, given)
            for j, (a, b) in enumerate(zip(given, pristine, strict=True)):
                if isinstance(a, torch.Tensor) and not _equal(a, b):
                    raise Rejected(f"modified its input {j} in place")
            refs = self.reference_outputs(pristine)
            errors.add(early, refs)
            poison(outs + early + refs + given + pristine)

    def time(self, fn: Callable[..., Any], errors: Errors) -> list[float]:
        """Warm-up, then `runs` timed calls. Before each call the inputs are refilled in place, alternating between
        two fresh input sets (a candidate that memoises by input address returns a stale answer), and the cache is
        flushed; the device is idle at the start of each timed region and fully synchronised at its end. The last
        call's answer is checked against the reference too."""
        sets = [self.problem.inputs(self.device, seed) for seed in self.timing_seeds]
        buffers = clone_all(sets[0])
        times: list[float] = []
        pending: list[float] = []
        early: list[torch.Tensor] = []
        total = self.warmup + self.runs
        for k in range(total):
            source = sets[k % 2]
            for buffer, value in zip(buffers, source, strict=True):
                if isinstance(buffer, torch.Tensor):
                    buffer.copy_(value)
            self.flush.zero_()
            self.sync()
            outs, early, elapsed_ms, pending_ms = self.timed_call(fn, buffers)
            if k >= self.warmup:
                self.check_outputs(outs, early, buffers)
                times.append(elapsed_ms)
                pending.append(pending_ms)
            if k < total - 1:
                poison(early)
                del outs, early
        if self.cuda and statistics.median(pending) > 0.1 + 0.05 * statistics.median(times):
            raise Rejected(f"left work running after its timed region (median {statistics.median(pending):.3f} ms "
                           "of device work still pending when its stream had finished: another stream?)")
        errors.add(early, self.reference_outputs(sets[(total - 1) % 2]))
        return times

    def energy_run(self, fn: Callable[..., Any], call_ms: float) -> EnergyRun | None:
        """Back-to-back calls on one input set, as a job's shard makes them, inside the meter's window (None
        without a meter)."""
        if self.meter is None:
            return None
        inputs = self.problem.inputs(self.device, seed=self.timing_seeds[0])
        return measure_energy(lambda: fn(*inputs), self.sync, self.meter, call_ms)

    def timed_call(self, fn: Callable[..., Any], inputs: list[Any]
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor], float, float]:
        threads = threads_now()
        if self.cuda:
            if _current_stream(self.device) != self.stream:
                raise Rejected("changed the current CUDA stream")
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            _record(start, self.stream)
            outs = tensors_of(fn(*inputs), "forward")
            _record(end, self.stream)
            end.synchronize()  # this stream is done: copy the outputs as they are now (on this stream) ...
            early = [o.clone() for o in outs]
            self.stream.synchronize()
            stream_done = _perf_counter()
            _synchronize(self.device)  # ... then wait for every stream: how long that took is work left pending
            pending_ms = (_perf_counter() - stream_done) * 1e3
            elapsed_ms = _elapsed_time(start, end)
            if _current_stream(self.device) != self.stream:
                raise Rejected("changed the current CUDA stream")
        else:
            t0 = _perf_counter()
            outs = tensors_of(fn(*inputs), "forward")
            elapsed_ms = (_perf_counter() - t0) * 1e3
            early = [o.clone() for o in outs]
            pending_ms = 0.0
        if started := new_threads(threads):
            raise Rejected(f"left thread {started[0]!r} running after its forward returned (work must finish on the "
                           "caller's thread)")
        return outs, early, elapsed_ms, pending_ms


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(str(exc))}"


def is_cuda_fault(exc: BaseException) -> bool:
    """A CUDA error (illegal address, device-side assert) leaves the context unusable: the child must start over."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return "CUDA error" in str(exc) and not isinstance(exc, torch.OutOfMemoryError)


def exit_with(evaluator_pid: int) -> None:
    """Kill this child's session (it and its compiler processes) once the evaluator that asked for it is gone.

    The fork server keeps a child alive (and the child the fork server) after the evaluator's process is killed, as
    Ray kills a cancelled shard's worker: a hanging candidate would then hold its CPU or GPU forever. Started before
    any candidate runs, so the thread checks never count it as a candidate's."""

    def watch() -> None:
        while True:
            _sleep(1.0)
            try:
                os.kill(evaluator_pid, 0)
            except ProcessLookupError:
                os.killpg(os.getpid(), signal.SIGKILL)
            except PermissionError:  # a pid reused by someone else's process: the evaluator is gone all the same
                os.killpg(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="farm-evaluator-watch", daemon=True).start()


def child_main(conn: Connection, log_path: str, evaluator_pid: int | None = None) -> None:
    """The child's loop: one JSON request per message on `conn`, one JSON answer each, until the parent closes it.

    Started through multiprocessing's forkserver: a clean spawned interpreter that imported torch and this module
    once (and never touched CUDA), forked per child, so a child costs milliseconds instead of a torch import. The
    child leads its own session (the parent kills it and any compiler processes it started as one group) and
    writes fds 1 and 2 to `log_path`: what a candidate prints goes there, and its last line explains a crash.
    """
    os.setsid()
    if evaluator_pid is not None:
        exit_with(evaluator_pid)
    gc.freeze()  # what the fork server imported stays: collections after each candidate only look at the rest
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    send, dumps = conn.send_bytes, json.dumps

    def answer(message: dict[str, Any]) -> None:
        send(dumps(message).encode())

    session: Session | None = None
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except EOFError:
            return
        if request["op"] == "setup":
            try:
                session = Session(request)
                answer({"ok": True, "info": session.setup()})
            except Exception as exc:
                answer({"ok": False, "error": describe(exc)})
                return
        elif request["op"] == "candidate" and session is not None:
            try:
                answer({"ok": True, "result": session.evaluate(request["candidate"]), "restart": False})
            except Exception as exc:  # a CUDA fault: report it, then let the parent start a fresh child
                answer({"ok": True, "restart": True, "result": {
                    "problem": session.problem.name, "candidate": request["candidate"]["name"], "compiled": True,
                    "sound": False, "error": f"failed: {describe(exc)}"}})
                return
