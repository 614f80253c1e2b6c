"""Farm's model of CPU power, for CPUs whose energy counters cannot be read (no RAPL, RAPL root-only, a VM).

The model: a CPU package rated at R watts with C logical cores spends R / C watts per busy core, and nothing for idle.
A window is billed the CPU time of this process and its children over the window:

    joules = busy core-seconds x (R / C)

- Busy core-seconds are the current process's CPU time (user + system, every thread, from the kernel's per-process
  CPU clock in nanoseconds) plus its children's: shards run in this process (the Ray worker), on as many threads as
  they use. Children count only once they have exited and been waited for (that is what the OS reports); other
  threads of this process count too, which in a Ray worker is little.
- Idle is billed nothing: idle power is spent whether or not the shard runs, and the scheduler compares what a shard
  adds. This makes the figure a lower bound of what the package drew.
- Resolution: the process's own CPU clock counts nanoseconds; /proc's figures (psutil, and the children's times)
  count 10 ms clock ticks, which billed a warm digits shard (3 ms of CPU) nothing at all.
- R: a constructor argument; else the environment variable FARM_CPU_RATED_W; else 10 W per logical core, at most
  150 W (a laptop's 8 threads: 80 W; a 64-thread server: 150 W, 2.3 W per thread).
Source model-estimate, scope package, always: it is never ranked against a counter.

`power()` is the whole machine's CPU utilisation since the previous call times R (psutil.cpu_percent), also
model-estimate: heartbeats show what the box is doing, not just Farm's shards.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import psutil

from farm.core.energy import Energy, EnergyScope, EnergySource, Power
from farm_agent.power import Clock, EnergyWindow

log = logging.getLogger("farm.agent.power.estimate")

RATED_ENV = "FARM_CPU_RATED_W"
WATTS_PER_CORE = 10.0
MAX_DEFAULT_WATTS = 150.0


class CpuTimes(Protocol):
    @property
    def user(self) -> float: ...
    @property
    def system(self) -> float: ...


class Process(Protocol):
    def cpu_times(self) -> CpuTimes: ...


def default_rated_watts(cores: int, environ: Mapping[str, str] | None = None) -> float:
    """FARM_CPU_RATED_W when set to a positive number (a bad value is logged and ignored), else 10 W per core up to
    150 W."""
    environ = os.environ if environ is None else environ
    raw = environ.get(RATED_ENV, "").strip()
    if raw:
        try:
            watts = float(raw)
        except ValueError:
            watts = 0.0
        if watts > 0:
            return watts
        log.warning("%s=%r is not a positive number of watts: using the default", RATED_ENV, raw)
    return min(WATTS_PER_CORE * max(1, cores), MAX_DEFAULT_WATTS)


@dataclass(frozen=True)
class ProcessTimes:
    user: float
    system: float
    children_user: float
    children_system: float


class CurrentProcess:
    """This process's CPU times at the kernel's full resolution: CLOCK_PROCESS_CPUTIME_ID (time.process_time, all
    threads, user + system, counted as user here) for itself, and os.times() for its waited-for children."""

    def cpu_times(self) -> ProcessTimes:
        children = os.times()
        return ProcessTimes(user=time.process_time(), system=0.0, children_user=children.children_user,
                            children_system=children.children_system)


def busy_seconds(times: CpuTimes) -> float:
    """CPU seconds in a psutil cpu_times(): user + system, and the children's where the platform reports them."""
    return (times.user + times.system + getattr(times, "children_user", 0.0)
            + getattr(times, "children_system", 0.0))


class CpuEstimateMeter:
    """Rated package power x this process's share of CPU time (see the module docstring)."""

    device = "cpu"
    source = EnergySource.MODEL_ESTIMATE
    scope = EnergyScope.PACKAGE
    available = True
    step_s = 0.0  # no step: the process's CPU clock counts nanoseconds

    def __init__(
        self,
        rated_watts: float | None = None,
        *,
        cores: int | None = None,
        process: Process | None = None,
        clock: Clock = time.monotonic,
        cpu_percent: Callable[[], float] | None = None,
        environ: Mapping[str, str] | None = None,
        reason: str = "",
    ) -> None:
        self.cores = cores or psutil.cpu_count(logical=True) or 1
        self.rated_watts = rated_watts if rated_watts else default_rated_watts(self.cores, environ)
        self.reason = reason
        self._process: Process = process if process is not None else CurrentProcess()
        self._clock = clock
        self._cpu_percent = cpu_percent or (lambda: psutil.cpu_percent(interval=None))
        self._cpu_percent()  # the first call only starts psutil's interval

    @property
    def watts_per_core(self) -> float:
        return self.rated_watts / self.cores

    @contextmanager
    def window(self) -> Iterator[EnergyWindow]:
        w = EnergyWindow()
        t0, cpu0 = self._clock(), busy_seconds(self._process.cpu_times())
        try:
            yield w
        finally:
            t1, cpu1 = self._clock(), busy_seconds(self._process.cpu_times())
            busy = max(0.0, cpu1 - cpu0)
            energy = Energy(joules=busy * self.watts_per_core, seconds=max(0.0, t1 - t0), source=self.source,
                            scope=self.scope)
            w.close(energy, t1 - t0, f"{busy:.3f} busy core-seconds x {self.watts_per_core:.2f} W per core "
                                     f"({self.rated_watts:g} W rated / {self.cores} cores); idle not billed")

    def power(self) -> Power | None:
        percent = self._cpu_percent()
        return Power(watts=self.rated_watts * min(max(percent, 0.0), 100.0) / 100.0, source=self.source,
                     scope=self.scope)

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"CpuEstimateMeter({self.rated_watts:g} W / {self.cores} cores)"
