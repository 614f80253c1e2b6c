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
        return _Fixed(jit_function, configs[0])

    def bench(kernel_call: Any, quantiles: Any = None) -> Any:
        # Short: a few milliseconds per config is enough to rank tiles, and every child process of the evaluator
        # tunes again (what it picks is only a search; the evaluator's timing of the whole model is the verdict).
        return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)

    return triton.autotune(configs=configs, key=key, do_bench=bench)(jit_function)


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
