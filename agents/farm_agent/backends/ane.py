"""The Apple Neural Engine through Core ML: the job's model converted once per node (cached by model hash), then
run by Core ML with compute units CPU_AND_NE, batch by batch, each padded up to its static batch bucket.

Offering runs in the agent daemon from the detected hardware: no coremltools, no torch. A machine that is not an
Apple Silicon Mac offers no `ane` at all (as a CPU box offers no CUDA). Running happens in a Ray worker on macOS.

How much of a given model Core ML actually places on the Neural Engine is known only once the model is converted:
`model_offer` turns a compute plan (farm_agent.coreml.compute_plan) into the offer for that model, available only
when most of its work runs on the ANE, with the share in its detail, which `farm nodes` shows.
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from farm.core.models import BackendName, BackendOffer, Hardware
from farm.core.tasks import Tuning
from farm_agent.coreml.buckets import batches, pad_to

if TYPE_CHECKING:
    import torch

    from farm_agent.coreml.compute_plan import PlanSummary
    from farm_agent.coreml.convert import Conversion

log = logging.getLogger("farm.agent.backends.ane")

EXAMPLE_ITEMS = 8  # items of the shard the model is converted with (their shape and dtype; values for the trace)


def available_on(hardware: Hardware) -> bool:
    return hardware.os == "darwin" and bool(hardware.apple_chip)


WARM_UP_SHAPES = True  # a shard's first batch converts the model (once a node) and loads it for Core ML


def offers(hardware: Hardware, cpus: int) -> list[BackendOffer]:
    # One slot: the Neural Engine is one device that Core ML schedules; two shards would only queue on it.
    if not available_on(hardware):
        return []
    return [BackendOffer(name=BackendName.ANE, device="ane",
                         detail=f"{hardware.apple_chip} Neural Engine, Core ML CPU_AND_NE, fp16", slots=1, threads=1)]


def model_offer(hardware: Hardware, plan: PlanSummary, model: str) -> BackendOffer | None:
    """The `ane` offer for one model, from its compute plan: unavailable (and why) when most of its work would not
    run on the Neural Engine. None on a machine with no ANE."""
    if not available_on(hardware):
        return None
    detail = f"{hardware.apple_chip} Neural Engine: {model}: {plan.describe()}"
    if plan.mostly_ane:
        return BackendOffer(name=BackendName.ANE, device="ane", detail=detail, slots=1, threads=1)
    return BackendOffer(name=BackendName.ANE, device="ane", detail=detail, slots=0, threads=1, available=False,
                        reason=f"only {100 * plan.ane_share:.0f}% of {model} would run on the Neural Engine")


def predict_in_buckets(predict: Callable[[int, np.ndarray], np.ndarray], inputs: np.ndarray, batch_size: int,
                       buckets: Sequence[int]) -> np.ndarray:
    """Outputs for `inputs` in input order: each batch padded up to its bucket, `predict(bucket, padded)` called,
    the padding's rows dropped."""
    outputs = []
    for start, stop, bucket in batches(len(inputs), batch_size, buckets):
        result = np.asarray(predict(bucket, pad_to(inputs[start:stop], bucket)), dtype=np.float32)
        outputs.append(result[: stop - start])
    if not outputs:
        raise ValueError("no inputs to run")
    return np.concatenate(outputs)


class LoadedPackage:
    """One MLModel per batch bucket (function) of a converted package, loaded for CPU_AND_NE and warmed up: the
    first load compiles for the ANE and the first predict pays its set-up, outside the shard's measured window."""

    def __init__(self, path: Path, buckets: Sequence[int], compute_units: str, example: np.ndarray) -> None:
        import coremltools as ct

        from farm_agent.coreml.convert import INPUT_NAME, OUTPUT_NAME
        from farm_agent.coreml.package_info import FUNCTION_PREFIX

        self.input_name, self.output_name = INPUT_NAME, OUTPUT_NAME
        self.models: dict[int, Any] = {
            bucket: ct.models.MLModel(str(path), compute_units=ct.ComputeUnit[compute_units],
                                      function_name=f"{FUNCTION_PREFIX}{bucket}")
            for bucket in buckets
        }
        for bucket in buckets:
            self.predict(bucket, pad_to(example[:bucket], bucket))

    def predict(self, bucket: int, batch: np.ndarray) -> np.ndarray:
        return self.models[bucket].predict({self.input_name: batch})[self.output_name]


_loaded: dict[Path, LoadedPackage] = {}
_conversions: weakref.WeakKeyDictionary[torch.nn.Module, Conversion] = weakref.WeakKeyDictionary()


def run(module: torch.nn.Module, inputs: np.ndarray, batch_size: int, device: str, threads: int,
        tuning: Tuning = Tuning()) -> np.ndarray:
    if sys.platform != "darwin":
        raise RuntimeError(f"the ane backend runs Core ML, which is macOS only, and this is {sys.platform}")
    from farm_agent.coreml.compute_plan import compute_plan
    from farm_agent.coreml.convert import cached_conversion, core_ml_dtype

    examples = inputs[:EXAMPLE_ITEMS]
    conversion = _conversions.get(module)
    if conversion is None:  # hashing the weights once per model per worker, not per shard
        conversion = cached_conversion(module, examples)
        _conversions[module] = conversion
        package = conversion.package
        try:
            plan = compute_plan(package.path, package.default_function, package.compute_units)
            log.info("%s: %s", package.path.name, plan.describe())
        except Exception as exc:  # the plan is information (macOS 14.4+); the model runs without it
            log.warning("no compute plan for %s: %s", package.path.name, exc)
        for note in conversion.notes:
            log.info("%s: %s", package.path.name, note)
    package = conversion.package
    data = np.ascontiguousarray(inputs.astype(core_ml_dtype(inputs.dtype), copy=False))
    loaded = _loaded.get(package.path)
    if loaded is None:
        loaded = LoadedPackage(package.path, package.buckets, package.compute_units, data)
        _loaded[package.path] = loaded
    return predict_in_buckets(loaded.predict, data, batch_size, package.buckets)


def warm(device: str) -> None:
    import torch  # noqa: F401 - what a shard imports first; Core ML's own loading is per model (cached_conversion)
