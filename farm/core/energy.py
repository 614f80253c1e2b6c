"""Energy and power figures. Every figure says where it came from and what it covers, so that only like is ranked
against like and estimates are shown as estimates."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from farm.core.frozen import Frozen


class EnergySource(StrEnum):
    COUNTER = "counter"  # a hardware energy counter: NVML total energy, RAPL energy_uj
    VENDOR_ESTIMATE = "vendor-estimate"  # the vendor's own model: Apple IOReport, powermetrics
    MODEL_ESTIMATE = "model-estimate"  # Farm's model: rated power × utilisation


# How far (as a fraction) a figure from each source may lie from the true energy, for ranking. A counter reads the
# hardware (NVML's H200 counter steps every 100 ms: well inside 5 % over a shard); Apple's IOReport figures are the
# vendor's own model of its SoC; rated power × utilisation can be off by half either way (the rated figure is a
# ceiling, and utilisation says nothing of what the cores execute). Keyed by the enum, found by its string too.
UNCERTAINTY: dict[str, float] = {
    EnergySource.COUNTER: 0.05, EnergySource.VENDOR_ESTIMATE: 0.25, EnergySource.MODEL_ESTIMATE: 0.5,
}


# A figure from fewer of its meter's steps than this measures the meter, not the work: each end of a window is
# uncertain by up to a step (on the H200, NVML's counter steps every 100 ms: a 7 ms shard read as 14 J).
METER_STEPS = 20


class EnergyScope(StrEnum):
    DEVICE = "device"  # one accelerator board or die
    PACKAGE = "package"  # a CPU socket (cores, caches, memory controller) or an SoC
    SYSTEM = "system"  # the whole machine


class Energy(Frozen):
    """Joules spent over a window of `seconds`."""

    joules: float = Field(ge=0)
    seconds: float = Field(ge=0)
    source: EnergySource
    scope: EnergyScope

    @property
    def watts(self) -> float:
        return self.joules / self.seconds if self.seconds > 0 else 0.0


class Power(Frozen):
    """An instantaneous (or short-average) power reading."""

    watts: float = Field(ge=0)
    source: EnergySource
    scope: EnergyScope


class DevicePower(Power):
    device: str


class EnergyBasis(StrEnum):
    """Which energy a job's efficiency is ranked by (the spec's `energy:`)."""

    MARGINAL = "marginal"  # above the device's idle draw: what lending it costs its owner
    TOTAL = "total"  # everything its meter read over the shard, idle draw included


# A marginal figure below this share of its total is within the meters' error of nothing: it is floored there, so a
# device whose work barely shows above its idle draw ranks as very cheap rather than free (or infinitely efficient).
MARGINAL_FLOOR = 0.05


def marginal_joules(energy: Energy, idle_w: float | None, idle_source: str) -> float | None:
    """The energy a shard added above its device's idle draw over the same window; None unless the idle draw was
    read on the same kind of meter (a counter's figure less an estimate's idle draw would mix unlike figures)."""
    if idle_w is None or idle_source != energy.source.value:
        return None
    return max(energy.joules - idle_w * energy.seconds, MARGINAL_FLOOR * energy.joules)


def energy_sum(energies: list[Energy | None]) -> Energy | None:
    """The workers' energy over one stretch, where every worker measured it with one kind of meter."""
    if not energies or any(e is None for e in energies):
        return None
    kinds = {(e.source, e.scope) for e in energies if e is not None}
    if len(kinds) != 1:
        return None  # a counter plus an estimate is no figure at all: only like adds to like
    source, scope = kinds.pop()
    return Energy(joules=sum(e.joules for e in energies if e is not None),
                  seconds=max(e.seconds for e in energies if e is not None), source=source, scope=scope)
