"""A job's PyTorch model as a Core ML ML Program for the Neural Engine, one function per batch bucket.

    conversion = convert(module, example_items, out=Path("digits.mlpackage"))
    conversion.package.functions      # batch_1, batch_8, ... with static shapes and dtypes read back from the spec
    conversion.notes                  # where the model is not Neural-Engine friendly, and why

What the package is, and why:
- ML Program, fp16 compute precision: the Neural Engine computes in fp16.
- Inputs and outputs keep an explicit dtype: float32 (int32 for integer inputs such as token ids: Core ML has no
  int64). Without it, coremltools makes them fp16 for macOS 13+ targets and results silently lose precision.
- Static shapes, one function per batch bucket (multifunction package, macOS 15+): the ANE compiles a fixed shape,
  and flexible ("range") shapes run on the CPU or GPU. A batch is padded up to its bucket (buckets.py). The
  functions share their weights in the package.
- Compute units CPU_AND_NE: a load-time choice in Core ML, recorded in the package's metadata for the ANE backend.
- Captured with torch.export, else torch.export lowered to core ATen ops, else torch.jit.trace (CAPTURES): coremltools
  9.0 is tested against torch 2.7 only. With torch 2.13, torch.export converts the models here; transformers' own
  BERT needs the core ATen lowering (coremltools has no converter for new_ones) and does not trace (a tensor turned
  into a Python int); jit.trace remains for models that torch.export refuses.
- Cached by model hash (architecture, weights, input item shape and dtype, buckets, coremltools version): a model
  converts once per node, under <FARM_STATE_DIR>/coreml/<hash>.mlpackage.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from farm_agent.coreml.ane_notes import ane_notes
from farm_agent.coreml.buckets import DEFAULT_BUCKETS, normalise
from farm_agent.coreml.package_info import (
    FUNCTION_PREFIX,
    META_BUCKETS,
    META_COMPUTE_UNITS,
    META_MODEL_HASH,
    META_REWRITES,
    META_SOURCE,
    PackageInfo,
    quiet_coremltools,
    read_package,
)
from farm_agent.coreml.static import static_form

if TYPE_CHECKING:
    import torch
    from torch import nn

COMPUTE_UNITS = "CPU_AND_NE"
INPUT_NAME = "input"
OUTPUT_NAME = "output"
# Bump when the conversion itself changes, so cached packages made the old way are not reused.
FORMAT_VERSION = "1"


class ConversionError(Exception):
    """The model cannot be converted; the message says why (both capture paths' errors)."""


@dataclass(frozen=True)
class Conversion:
    package: PackageInfo
    notes: tuple[str, ...]  # rewrites made and Neural-Engine obstacles found
    source: str  # how the model was captured: a CAPTURES key
    seconds: float  # 0 when it came from the cache
    cached: bool


def core_ml_dtype(dtype: np.dtype) -> type:
    """float32 for floating inputs, int32 for integer and boolean ones (Core ML's input types)."""
    return np.float32 if np.issubdtype(dtype, np.floating) else np.int32


def model_hash(module: nn.Module, item_shape: Sequence[int], item_dtype: np.dtype, buckets: Sequence[int]) -> str:
    """What identifies a conversion: the model's class, architecture and weights, and what it is converted for."""
    import coremltools as ct
    import torch

    digest = hashlib.sha256()
    for part in (FORMAT_VERSION, ct.__version__, f"{type(module).__module__}.{type(module).__qualname__}",
                 repr(module), repr(tuple(item_shape)), str(np.dtype(item_dtype)), repr(tuple(buckets))):
        digest.update(part.encode())
        digest.update(b"\0")
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


def example_batch(examples: np.ndarray, size: int) -> np.ndarray:
    """`size` real items (repeated when there are fewer), in the dtype Core ML will be given."""
    batch = np.resize(examples, (size, *examples.shape[1:]))
    return np.ascontiguousarray(batch.astype(core_ml_dtype(examples.dtype)))


def _export(module: nn.Module, batch: torch.Tensor, decompose: bool) -> object:
    import torch

    with warnings.catch_warnings():  # torch.export's own deprecation notices are not the user's concern
        warnings.simplefilter("ignore", FutureWarning)
        exported = torch.export.export(module, (batch,), strict=False)
        # Without decompositions composite ops that coremltools converts whole (einsum) stay whole; the core ATen
        # decompositions lower ops it does not know (new_ones, in transformers' masks) at the cost of more ops.
        return exported.run_decompositions() if decompose else exported.run_decompositions({})


def _trace(module: nn.Module, batch: torch.Tensor) -> object:
    import torch

    with warnings.catch_warnings():  # TracerWarnings, and jit.trace's own deprecation
        warnings.simplefilter("ignore")
        return torch.jit.trace(module, batch, check_trace=False)


# How a model is captured for coremltools, tried in this order; the first that converts is used for every bucket.
CAPTURES: dict[str, Callable[[nn.Module, torch.Tensor], object]] = {
    "torch.export": lambda module, batch: _export(module, batch, decompose=False),
    "torch.export (core ATen)": lambda module, batch: _export(module, batch, decompose=True),
    "torch.jit.trace": _trace,
}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _convert_bucket(module: nn.Module, batch: np.ndarray, sources: Sequence[str]) -> tuple[object, str]:
    """The model converted for one batch shape, through the first capture in `sources` that converts."""
    import coremltools as ct
    import torch

    failures = []
    for source in sources:
        try:
            captured = CAPTURES[source](module, torch.from_numpy(batch))
        except Exception as exc:  # capture failures span many types; each says what it refused
            failures.append(f"{source}: {type(exc).__name__}: {_first_line(exc)}")
            continue
        try:
            with _quiet():
                return _ct_convert(ct, captured, batch), source
        except Exception as exc:  # the converter's errors name the op it could not convert
            failures.append(f"{source} then coremltools: {type(exc).__name__}: {_first_line(exc)}")
    raise ConversionError("; ".join(failures))


def _ct_convert(ct: Any, captured: object, batch: np.ndarray) -> object:
    return ct.convert(
        captured,
        inputs=[ct.TensorType(name=INPUT_NAME, shape=batch.shape, dtype=batch.dtype.type)],
        outputs=[ct.TensorType(name=OUTPUT_NAME, dtype=np.float32)],
        convert_to="mlprogram",
        compute_precision=ct.precision.FLOAT16,
        compute_units=ct.ComputeUnit[COMPUTE_UNITS],
        minimum_deployment_target=ct.target.macOS15,
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """coremltools draws a progress bar per pass on stderr and warns about casts of its own constants (fp16 overflow of
    an unbounded clip); a conversion's own errors are raised, not printed."""
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def convert(module: nn.Module, examples: np.ndarray, out: Path, buckets: Sequence[int] = DEFAULT_BUCKETS,
            *, model_key: str | None = None) -> Conversion:
    """Convert `module` for items shaped like `examples[i]` (a few real items), writing `out` (.mlpackage).

    Raises ConversionError when the model cannot be converted, ValueError for bad buckets or no examples."""
    quiet_coremltools()
    import coremltools as ct

    buckets = normalise(buckets)
    if len(examples) == 0:
        raise ValueError("no example items to convert the model with")
    began = time.perf_counter()
    form = static_form(module)
    key = model_key or model_hash(module, examples.shape[1:], examples.dtype, buckets)
    source = ""
    with tempfile.TemporaryDirectory(prefix="farm-coreml-") as tmp:
        descriptor = ct.utils.MultiFunctionDescriptor()
        sources: Sequence[str] = tuple(CAPTURES)
        for bucket in buckets:
            mlmodel, source = _convert_bucket(form.module, example_batch(examples, bucket), sources)
            sources = (source,)  # every bucket the same way
            path = Path(tmp) / f"{FUNCTION_PREFIX}{bucket}.mlpackage"
            mlmodel.save(str(path))  # type: ignore[attr-defined]
            descriptor.add_function(str(path), src_function_name="main",
                                    target_function_name=f"{FUNCTION_PREFIX}{bucket}")
        descriptor.default_function_name = f"{FUNCTION_PREFIX}{buckets[-1]}"
        merged = Path(tmp) / "merged.mlpackage"
        with _quiet():
            ct.utils.save_multifunction(descriptor, str(merged))
        # save_multifunction drops metadata: set it on the merged package.
        package = ct.models.MLModel(str(merged), skip_model_load=True)
        package.user_defined_metadata.update({
            META_COMPUTE_UNITS: COMPUTE_UNITS, META_MODEL_HASH: key, META_SOURCE: source,
            META_BUCKETS: ",".join(str(b) for b in buckets), META_REWRITES: json.dumps(form.notes),
        })
        staged = Path(tmp) / "staged.mlpackage"
        package.save(str(staged))
        _replace(staged, out)
    info = read_package(out)
    notes = (*form.notes, *ane_notes(info.function(buckets[-1])))
    return Conversion(package=info, notes=notes, source=source, seconds=time.perf_counter() - began, cached=False)


def _replace(staged: Path, out: Path) -> None:
    """Move the finished package to `out`, replacing what was there (a reader never sees half a package)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    landing = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    shutil.move(str(staged), landing / "package")
    old = out.with_name(f".{out.name}.old.{os.getpid()}")
    if out.exists():
        out.rename(old)
    (landing / "package").rename(out)
    shutil.rmtree(landing, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def cache_dir(state_dir: Path | None = None) -> Path:
    from farm.local import default_state_dir

    return (state_dir or default_state_dir()) / "coreml"


def cached_conversion(module: nn.Module, examples: np.ndarray, buckets: Sequence[int] = DEFAULT_BUCKETS,
                      *, state_dir: Path | None = None) -> Conversion:
    """The conversion of `module` from the node's cache, converting it the first time."""
    quiet_coremltools()
    buckets = normalise(buckets)
    key = model_hash(module, examples.shape[1:], examples.dtype, buckets)
    path = cache_dir(state_dir) / f"{key}.mlpackage"
    path.parent.mkdir(parents=True, exist_ok=True)
    # Workers on one node may meet the same model at once: one converts, the others wait and read its package.
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.exists():
                info = read_package(path)
                rewrites = tuple(json.loads(info.metadata.get(META_REWRITES, "[]")))
                return Conversion(package=info, notes=(*rewrites, *ane_notes(info.function(buckets[-1]))),
                                  source=info.metadata.get(META_SOURCE, ""), seconds=0.0, cached=True)
            return convert(module, examples, path, buckets, model_key=key)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
