"""Turning a template's source text into a Triton kernel, lazily, once per specialisation, and never fatally.

A template kernel is Python source with placeholders (the epilogue's parameters and lines). Triton's JIT reads a
kernel's source from its file, so each specialisation is written to a file named by the hash of its text (under
the temporary folder, shared by every process of this user) and imported from there. Triton is imported only here,
when a rewritten model first runs a template on a GPU or under TRITON_INTERPRET=1.

`Compiled` wraps a kernel so that a template that fails to build or to compile for a shape is recorded and its
region falls back to PyTorch instead of failing the model (FAILURES: what failed and why, for the benchmark's log).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

_MODULES: dict[str, ModuleType] = {}
FAILURES: dict[str, str] = {}  # template key -> first error, one line


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def load_source(source: str, prefix: str) -> ModuleType:
    """The module of this source text, written and imported once per process."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"farm_template_{prefix}_{digest}"
    if name in _MODULES:
        return _MODULES[name]
    folder = Path(tempfile.gettempdir()) / f"farm-templates-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        part = path.with_suffix(f".{os.getpid()}.tmp")
        part.write_text(source)
        os.replace(part, path)  # atomic: concurrent processes never read half a file
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _MODULES[name] = module
    return module


def autotuned(jit_function: Any, configs: list[Any], key: list[str]) -> Any:
    """`jit_function` under triton.autotune: the configs' own timings choose among them (a search, not a verdict:
    the evaluator times the whole candidate). Under the CPU interpreter only the first config runs."""
    import triton
    import triton.testing

    if interpreting():
        configs = configs[:1]
    if len(configs) == 1:
        return Launcher(_Fixed(jit_function, configs[0]), jit_function, [])

    def bench(kernel_call: Any, quantiles: Any = None) -> Any:
        # Short: a few milliseconds per config is enough to rank tiles, and every child process of the evaluator
        # tunes again (what it picks is only a search; the evaluator's timing of the whole model is the verdict).
        return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)

    return Launcher(triton.autotune(configs=configs, key=key, do_bench=bench)(jit_function), jit_function, key)


FAST_LAUNCH = True  # benchmarks/kernels/call_overhead.py turns it off to compare


class Launcher:
    """A template kernel's launches: the first of each kind through Triton (autotuning, specialising, compiling), the
    next ones straight to the compiled kernel it chose.

    The evaluator times a call from an idle device, so the host's work before the kernel starts is part of a
    candidate's time, and Triton's own path (the autotuner's lookup, the JIT's binding and specialisation, on every
    call) cost a memory-bound template more than its margin over Inductor. A launch is of the same kind as an
    earlier one when everything Triton decides from stays the same: the constexprs, the values of the autotuning
    key, and what Triton specialises a runtime argument on (a tensor's dtype and 16-byte alignment, and its device,
    where the kernel is loaded; an int's being 1, its divisibility by 16 and its width; a float's type). Anything
    else (the interpreter, a config with a pre-hook) goes through Triton every time.
    """

    def __init__(self, inner: Any, jit_function: Any, key: list[str]) -> None:
        self.inner, self.fn, self.key = inner, jit_function, key
        self.names = list(jit_function.arg_names)
        self.key_at = [self.names.index(k) for k in key]
        self.known: dict[Any, tuple[Any, dict[str, Any]]] = {}  # kind of launch -> (compiled kernel, its meta)

    def __getitem__(self, grid: Any) -> Any:
        def run(*args: Any, **constexprs: Any) -> Any:
            if not FAST_LAUNCH or interpreting():
                return self.inner[grid](*args, **constexprs)
            kind = (_kind(args), tuple(constexprs.items()),
                    tuple(args[i] if i < len(args) else constexprs.get(name) for i, name in zip(self.key_at, self.key)))
            known = self.known.get(kind)
            if known is None:
                compiled = self.inner[grid](*args, **constexprs)
                config = getattr(self.inner, "best_config", None) or getattr(self.inner, "config", None)
                if compiled is not None and config is not None and config.pre_hook is None \
                        and hasattr(compiled, "run"):
                    self.known[kind] = (compiled, dict(config.kwargs))
                return compiled
            compiled, meta = known
            values = dict(zip(self.names, args))
            values.update(constexprs)
            values.update(meta)
            where = grid(values) if callable(grid) else grid
            ordered = [values[name] for name in self.names]
            _launch(compiled, where, ordered)
            return compiled
        return run


def _kind(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What Triton specialises each runtime argument on."""
    import torch

    found: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append((a.dtype, a.get_device(), a.data_ptr() % 16 == 0))  # a kernel is loaded per device
        elif isinstance(a, bool):
            found.append(("bool", a))
        elif isinstance(a, int):
            found.append(("int", a == 1, a % 16 == 0, -2**31 <= a < 2**31, a >= 2**63))
        elif isinstance(a, float):
            found.append("float")
        else:
            found.append(("other", a))
    return tuple(found)


def _launch(compiled: Any, grid: Any, ordered: list[Any]) -> None:
    """What triton's JITFunction.run does once it has the compiled kernel: the launch on the current stream."""
    from triton import knobs
    from triton.runtime.driver import driver

    stream = driver.active.get_current_stream(driver.active.get_current_device())
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    compiled.run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *ordered), knobs.runtime.launch_enter_hook,
                 knobs.runtime.launch_exit_hook, *ordered)


class _Fixed:
    """One config applied directly (no timing): its meta-parameters and launch options."""

    def __init__(self, jit_function: Any, config: Any) -> None:
        self.fn, self.config = jit_function, config

    def __getitem__(self, grid: Any) -> Any:
        launch = self.fn[grid]
        kwargs = dict(self.config.kwargs)
        options = {"num_warps": self.config.num_warps, "num_stages": self.config.num_stages}

        def run(*args: Any, **more: Any) -> Any:
            return launch(*args, **kwargs, **options, **more)
        return run


def record_failure(key: str, exc: BaseException) -> None:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    FAILURES.setdefault(key, text[:400])
    print(f"farm templates: {key} failed, falling back to PyTorch ({text[:200]})", file=sys.stderr)
