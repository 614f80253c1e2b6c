"""A candidate's energy per call, read on the device's own energy meter (farm_agent.power) as a job's shard is.

After its timed runs, the evaluator's worker calls a candidate back to back, as a job's shard does (no cache flush
between calls), for long enough that the meter's window spans METER_STEPS of its steps (on the H200, NVML's
total-energy counter steps every 100 ms: ~2 s): a shorter window would measure the counter's step, not the work. The
window's joules less the device's idle draw over its seconds, shared among the calls, is the candidate's cost under
the `energy` objective (farm.core.tuning.call_cost). On a GPU only: a CPU's meter here is a model estimate of this
process's CPU time, which ranks nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from farm.core.energy import EnergySource
from farm.core.tuning import calls_for_meter
from farm_agent.power import PowerMeter, idle_power, meter_for


@dataclass(frozen=True)
class EnergyRun:
    """What one meter window over back-to-back calls read."""

    calls: int
    seconds: float
    joules: float


def meter_name(device: Any) -> str:
    """The meter's name for a torch CUDA device: by UUID, since NVML's order and CUDA's can differ (power/nvml.py)."""
    import torch

    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return f"cuda:{uuid if uuid.startswith('GPU-') else 'GPU-' + uuid}"


def open_meter(device: Any) -> PowerMeter | None:
    """The device's energy counter, or None where it has none (a power-sample meter's 1 s averages lag the load:
    too coarse to rank candidates by)."""
    meter = meter_for(meter_name(device))
    return meter if meter.available and meter.source is EnergySource.COUNTER else None


def measure(call: Callable[[], Any], sync: Callable[[], None], meter: PowerMeter, call_ms: float) -> EnergyRun | None:
    """`call` back to back, enough times (from its measured `call_ms`) to fill METER_STEPS of the meter's steps,
    inside one window; `sync` waits for the device, so that the window covers every kernel launched."""
    calls = calls_for_meter(call_ms, meter.step_s)
    sync()
    with meter.window() as window:
        for _ in range(calls):
            call()
        sync()
    energy = window.energy
    if energy is None or energy.seconds <= 0:
        return None
    return EnergyRun(calls=calls, seconds=energy.seconds, joules=energy.joules)


def idle_watts(meter: PowerMeter | None) -> float | None:
    """The device's draw while this process runs nothing on it (a window of METER_STEPS steps)."""
    if meter is None:
        return None
    power = idle_power(meter)
    return power.watts if power is not None else None
