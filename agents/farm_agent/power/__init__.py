"""Power meters: how much energy a device spent over a window of work, and what it draws now.

    meter = meter_for("cuda:0")            # never raises for a missing library or permission: see meter.reason
    with meter.window() as w:
        run_shard()                        # GPU work: synchronize the device before the block ends
    w.energy                               # Energy(joules, seconds, source, scope), or None when unavailable
    meter.power()                          # Power for heartbeats and dashboards, or None when unknown
    meter.step_s                           # how often its reading moves (0: no step); shards last 20 of them
    idle_power(meter)                      # the device's draw while nothing runs on it, on this meter

One meter per file: `nvml` (NVIDIA), `rapl` (Linux CPU packages), `estimate` (Farm's CPU model), `apple` (Apple
Silicon). The chooser, `meter_for`, picks the best reading the device offers and falls back, saying why:

    cuda:N | cuda:GPU-<uuid>  NVML total-energy counter -> NVML power samples integrated -> unavailable
    cpu (Linux)               RAPL package counters -> model estimate
    cpu (macOS)               Apple CPU energy (IOReport) -> model estimate
    ane | mps | soc           Apple ANE / GPU / SoC energy (macOS only) -> unavailable

Every figure carries its source and scope (farm.core.energy), so only like is ranked against like.

This package is imported by the agent daemon: it stays light. No torch, and pynvml, zeus_apple_silicon and the
command-line tools are loaded only when a meter for that device is asked for.

Zeus (PyPI `zeus`, ML.ENERGY; 0.16.0 read): not used, though its code was read and it shaped what is here.
- Weight: its hard requirements are numpy, pandas, scikit-learn, nvidia-ml-py, pydantic, rich, tyro, httpx, amdsmi
  and python-dateutil, and `zeus.monitor.power` imports scikit-learn at import time (for `auc`). The agent daemon
  runs on people's laptops and must stay light; pandas + scikit-learn + amdsmi for four subtractions is not that.
- Short windows: `ZeusMonitor.begin_window/end_window` read the NVML counter at whatever phase of its 100 ms step the
  call lands on, so a 250 ms window counts 2 or 3 steps (-20 % / +20 % at steady power); its only remedy is
  `approx_instant_energy`, used only when the delta is exactly zero. Here the reads are aligned to step edges.
- RAPL: its wrap-around tracker spawns one multiprocessing *spawn* process per RAPL file (a second Python
  interpreter per package in the daemon); a permission error raises instead of falling back to an estimate.
  Here a wrap is handled from max_energy_range_uj in the window (RaplMeter says when that is not enough).
- Windows sync through torch (or jax, cupy) by importing it; here the backend synchronizes, and nothing imports torch.
What was taken from it: NVML's counter where `nvmlDeviceGetTotalEnergyConsumption` is supported (Volta and later) and
integrated power samples only where it is not; RAPL package zones with max_energy_range_uj for the wrap.

zeus-apple-silicon (PyPI, 1.1.0 read): USED on macOS when installed, imported lazily. It has no Python dependencies
(a ~60 KB nanobind extension; wheels for macOS arm64), needs no sudo, and reads IOReport's cumulative "Energy Model"
counters in mJ, so a window is two reads and a subtraction, like NVML: better than integrating averaged power
samples. Where it is not installed the Apple meter runs `macmon pipe` (sudoless) and then `powermetrics` (root only)
and integrates their samples. It is not in pyproject.toml: the owner of that file decides (suggested: an extra
`mac = ["zeus-apple-silicon>=1.1; sys_platform == 'darwin' and platform_machine == 'arm64'"]`).
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from farm.core.energy import METER_STEPS, Energy, EnergyScope, EnergySource, Power

log = logging.getLogger("farm.agent.power")

Clock = Callable[[], float]  # seconds; tests pass a fake that replays a recording
Sleep = Callable[[float], None]

APPLE_DEVICES = ("ane", "mps", "soc")


class EnergyWindow:
    """What `with meter.window() as w:` gives. `w.energy` is read once the block has exited (reading it while the
    window is open raises RuntimeError); it is None only from a meter that cannot measure (see `note`)."""

    def __init__(self) -> None:
        self._energy: Energy | None = None
        self._closed = False
        self._later: Callable[[], tuple[Energy | None, str]] | None = None
        self._settling = threading.Lock()
        self.wall_seconds = 0.0  # how long the block itself ran; `energy.seconds` is the span the figure covers
        self._note = ""  # how the figure was made, where that is worth knowing (alignment, coverage, fallback)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def energy(self) -> Energy | None:
        """The window's energy; where its meter finishes it after the block (close_later), waits for that."""
        if not self._closed:
            raise RuntimeError("the energy window is still open: read w.energy after the with block")
        self._settle()
        return self._energy

    @property
    def note(self) -> str:
        self._settle()
        return self._note

    def close(self, energy: Energy | None, wall_seconds: float, note: str = "") -> None:
        """Called by the meter when the block exits."""
        self._energy, self.wall_seconds, self._note, self._closed = energy, max(0.0, wall_seconds), note, True

    def close_later(self, finish: Callable[[], tuple[Energy | None, str]], wall_seconds: float) -> None:
        """Called by a meter that finds the figure after the block (an NVML end edge, found while the next shard
        runs): `finish` gives it, once, when it is first read."""
        self._later, self.wall_seconds, self._closed = finish, max(0.0, wall_seconds), True

    def _settle(self) -> None:
        with self._settling:
            if self._later is not None:
                self._energy, self._note = self._later()
                self._later = None


class PowerMeter(Protocol):
    """What every meter offers. `source` and `scope` label every figure it makes."""

    device: str  # "cuda:0", "cpu", "ane", "mps", "soc"
    source: EnergySource
    scope: EnergyScope
    available: bool  # False: window() yields energy None and power() is None
    reason: str  # "" when the meter measures as intended; else why it fell back, or why it cannot measure

    @property
    def step_s(self) -> float:
        """How often the reading moves, in seconds (NVML's H200 counter: 0.1); 0 for a meter without steps (Farm's
        model estimate). A window shorter than METER_STEPS steps measures the meter, not the work."""
        ...

    def window(self) -> AbstractContextManager[EnergyWindow]:
        """`with meter.window() as w: run()`, then `w.energy`."""
        ...

    def power(self) -> Power | None:
        """A current reading for heartbeats and dashboards, or None when unknown."""
        ...

    def close(self) -> None:
        """Lets go of what the meter holds (an NVML session, a sampling subprocess); idempotent."""
        ...


@runtime_checkable
class ReadsMemory(Protocol):
    """A meter that also reads its device's memory (NVML's): (used, total) bytes, or None when it cannot say."""

    def memory(self) -> tuple[int, int] | None: ...


class UnavailableMeter:
    """A device that cannot be metered here, and why. Its window yields energy None; `source` and `scope` are what
    the device's meter would have reported, so a caller that forgets to check `available` still labels honestly."""

    available = False
    step_s = 0.0

    def __init__(self, device: str, reason: str, source: EnergySource, scope: EnergyScope) -> None:
        self.device, self.reason, self.source, self.scope = device, reason, source, scope

    @contextmanager
    def window(self) -> Iterator[EnergyWindow]:
        w = EnergyWindow()
        try:
            yield w
        finally:
            w.close(None, 0.0, note=f"not measured: {self.reason}")

    def power(self) -> Power | None:
        return None

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"UnavailableMeter({self.device!r}, reason={self.reason!r})"


IDLE_MIN_S = 1.0  # the shortest idle reading: a second of a steady idle draw is within a few % on every meter here


def idle_power(meter: PowerMeter, sleep: Sleep = time.sleep) -> Power | None:
    """The device's draw while nothing of Farm's runs on it, on `meter` itself (so that a shard's marginal energy is
    its meter's figure less this draw over its window, like against like): a window of METER_STEPS steps (at least
    IDLE_MIN_S) over which the caller runs nothing. The agent takes it before its Ray node starts.

    Farm's model estimate bills only the CPU time of the process it measures, so its idle draw is 0 by construction
    (no reading is taken): its figures are already the shard's own. None where the meter cannot measure."""
    if not meter.available:
        return None
    if meter.source is EnergySource.MODEL_ESTIMATE:
        return Power(watts=0.0, source=meter.source, scope=meter.scope)
    with meter.window() as w:
        sleep(max(METER_STEPS * meter.step_s, IDLE_MIN_S))
    energy = w.energy
    if energy is None or energy.seconds <= 0:
        return None
    return Power(watts=energy.joules / energy.seconds, source=energy.source, scope=energy.scope)


def meter_for(
    device: str,
    *,
    root: Path = Path("/"),
    system: str | None = None,
    nvml: Any | None = None,
    cpu_rated_watts: float | None = None,
    apple: Any | None = None,
) -> PowerMeter:
    """The best meter for `device` on this machine; never raises for a missing library, tool or permission.

    device: "cuda:N" (N is the NVML index, as in Hardware.gpus; CUDA's own order can differ, see nvml.py),
    "cuda:GPU-<uuid>", "cpu", "ane", "mps" (the Apple GPU) or "soc" (the whole Apple SoC).
    root: where /sys lives (tests pass a fake tree). system: platform.system().lower() (tests pass another).
    nvml: a pynvml stand-in (tests). cpu_rated_watts: the CPU's rated package power for the model estimate
    (default: FARM_CPU_RATED_W, else from the core count). apple: an apple.AppleTools (tests).
    Raises ValueError only for a device name that is none of the above: that is a programming error.
    """
    system = system if system is not None else platform.system().lower()
    kind, _, index = device.partition(":")
    if kind == "cuda":
        from farm_agent.power.nvml import open_nvml_meter

        return open_nvml_meter(index or "0", nvml=nvml)
    if kind == "cpu" and not index:
        return _cpu_meter(root, system, cpu_rated_watts, apple)
    if kind in APPLE_DEVICES and not index:
        from farm_agent.power.apple import open_apple_meter

        return open_apple_meter(kind, system=system, tools=apple)
    raise ValueError(f"no power meter for device {device!r}: expected cuda:N, cuda:GPU-<uuid>, cpu, ane, mps or soc")


def _cpu_meter(root: Path, system: str, rated_watts: float | None, apple: Any | None) -> PowerMeter:
    from farm_agent.power.estimate import CpuEstimateMeter

    if system == "darwin":
        from farm_agent.power.apple import open_apple_meter

        mac = open_apple_meter("cpu", system=system, tools=apple)
        if mac.available:
            return mac
        why = mac.reason
    else:
        from farm_agent.power.rapl import open_rapl_meter

        rapl, why = open_rapl_meter(root)
        if rapl is not None:
            return rapl
    reason = f"{why}; using Farm's model estimate instead"
    log.debug("CPU power: %s", reason)  # the agent logs meter.reason once it has registered
    return CpuEstimateMeter(rated_watts, reason=reason)
