"""Where an inference shard's time went on its node, as it reports it in its figures' metrics (numbers only): before
its measured window (loading the model, waiting for the first batch, tuning it for the device where the job asks,
warming the model up on it) and inside it (waiting for the next batch to be read and decoded, sending the outputs
to the head; the rest is the model's). A job that waits on its input is bound by reading, one whose window is the
model's by its device: `farm job --explain` says which, per device. Pure: the figures are a node's, so they are
bounded here, never trusted."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

PREFIX = "time_"  # the metrics' names: time_load_s, ...
MAX_S = 7 * 24 * 3600.0  # no phase of one shard lasts longer; a larger figure is a node's invention


@dataclass(frozen=True)
class ShardPhases:
    """Seconds. `window` is the shard's measured time (its `seconds`), of which `input_wait` and `output` are parts."""

    load: float = 0.0  # the model loaded (nothing where this worker already holds it)
    first_batch: float = 0.0  # the shard's first batch awaited (read ahead: often already there)
    warm_up: float = 0.0  # the model run once on each batch shape it has not run yet here (CUDA's, cuDNN's first)
    tuning: float = 0.0  # a tuning run for this device on the warm-up batch (a job's tune_budget_s), not in warm_up
    input_wait: float = 0.0  # in the window: the next batch awaited (reading and decoding slower than the model)
    output: float = 0.0  # in the window: the outputs handed to the head's upload

    def seconds(self) -> dict[str, float]:
        """By name, as the job's protobuf ShardTime names them: load_s, first_batch_s, ..."""
        return {f"{f.name}_s": getattr(self, f.name) for f in fields(self)}

    def metrics(self) -> dict[str, float]:
        """As a shard's figures carry them: time_load_s, ..."""
        return {PREFIX + name: value for name, value in self.seconds().items()}

    @classmethod
    def of(cls, metrics: Mapping[str, float], window: float) -> ShardPhases | None:
        """The phases a shard's figures report, each within [0, MAX_S] and the window's parts within the window;
        None where they report none (a kind that does not measure them, an older node)."""
        found = {f.name: metrics.get(f"{PREFIX}{f.name}_s") for f in fields(cls)}
        if all(value is None for value in found.values()):
            return None
        bounded = {name: _bounded(value, MAX_S) for name, value in found.items()}
        window = _bounded(window, MAX_S)
        bounded["input_wait"] = min(bounded["input_wait"], window)
        bounded["output"] = min(bounded["output"], window - bounded["input_wait"])
        return cls(**bounded)

    @classmethod
    def of_seconds(cls, seconds: Mapping[str, float], window: float) -> ShardPhases | None:
        """`of`, from the names seconds() gives."""
        return cls.of({PREFIX + name: value for name, value in seconds.items()}, window)

    @property
    def before(self) -> float:
        return self.load + self.first_batch + self.warm_up + self.tuning

    def __add__(self, other: ShardPhases) -> ShardPhases:
        return ShardPhases(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


def _bounded(value: float | None, most: float) -> float:
    return min(max(value, 0.0), most) if value is not None and math.isfinite(value) else 0.0


def before_text(phases: ShardPhases) -> str:
    """What came before the window, the largest parts named: 'loading the model 0.31 s, first batch 0.90 s,
    tuning 33.70 s, warm-up 1.21 s'."""
    parts = [("loading the model", phases.load), ("first batch", phases.first_batch), ("tuning", phases.tuning),
             ("warm-up", phases.warm_up)]
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in parts if seconds >= 0.005) or "nothing"


def window_text(phases: ShardPhases, window: float) -> str:
    """The window's parts as shares: 'the model 54 %, waiting for input 42 %, sending outputs 4 %'."""
    if window <= 0:
        return "no window"
    model = max(window - phases.input_wait - phases.output, 0.0)
    parts = [("the model", model), ("waiting for input", phases.input_wait), ("sending outputs", phases.output)]
    return ", ".join(f"{name} {100 * seconds / window:.0f} %" for name, seconds in parts)


def bound_by(phases: ShardPhases, window: float) -> str:
    """Which the window waited on most: 'its input' where the next batch was awaited over half of it, else 'the
    model' (what ran on the device, with the copies to and from it)."""
    return "its input (reading and decoding)" if window > 0 and phases.input_wait > window / 2 else "the model"


def summed(shards: Iterable[tuple[ShardPhases, float]]) -> tuple[ShardPhases, float]:
    """Several shards' phases and windows, added."""
    total, window = ShardPhases(), 0.0
    for phases, seconds in shards:
        total, window = total + phases, window + seconds
    return total, window
