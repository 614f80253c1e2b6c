"""NVIDIA GPUs through NVML (pynvml from nvidia-ml-py, imported only when a cuda meter is asked for).

Where the GPU has it (Volta and later), the window is the difference of NVML's cumulative energy counter,
`nvmlDeviceGetTotalEnergyConsumption` (mJ since the driver loaded): source counter, scope device (the board:
GPU and its memory).

That counter does not move smoothly: on the H200 it steps every ~100 ms. Two reads at arbitrary moments count a
whole number of steps over a span that is not a whole number of steps, so a 250 ms window at steady power reads 2 or 3
steps: 0.8x or 1.2x the true watts (measured: 488 to 850 W for a 680 W load). So each end of a window is aligned to a
step edge: read the counter, keep reading it (a read every `poll_s`, 2 ms, or back to back where a read itself takes
longer) until the value changes, for at most `align_timeout_s` (120 ms: one step and some slack). The edge lies
between the last read that saw the old value and the first that saw the new one; each read is taken at the middle of
its call (a read cost ~3 ms on the lent H200, 15 ms at the 99th percentile), and the edge at the middle of those two
moments. The window's joules are the counter difference between the two edges and its seconds the time between them:
whole steps over the time those steps took, so joules/seconds is unbiased at any length; its jitter is the edges'
half-brackets over the window (2-3 ms each on the H200: ~1 % of a 300 ms span). Where a bracket is wider than
`WIDE_EDGE_S` (a slow read), the window's note says how wide.
The cost: entering waits up to one step (the work starts just after an edge) and exiting waits up to one step (the
figure then also covers up to 100 ms after the block, at whatever the GPU drew then: measured at 680 W steady, a
1.0 s block of matmuls read 651-657 W over 1.10-1.12 s). A window opened within CHAIN_S of the last one's end (a
worker's next shard) waits for nothing: it starts at that window's end edge, so a worker's windows tile its time
and the moments between two shards are billed to the later one. A meter whose `defer` is on (a shard worker's)
also finds a window's end edge in a thread of its own: the block returns at once, the next shard starts, and the
figure is there when first read (EnergyWindow.close_later). Where the counter does not step within the timeout (it
should while the GPU draws anything), that end is not aligned and the window says so.

GPU work is asynchronous: the block must synchronize the device before it ends (the backend does; this module never
imports torch), or the work is billed to whatever window is open when the GPU runs it.

Where the counter is not supported (pre-Volta boards, common in spare boxes), a background thread samples
`nvmlDeviceGetPowerUsage` (mW) every `period_s` and the window integrates the samples (trapezoid), with a sample read
at each end of the window. That is still a reading of the device, but of the driver's own power sensor and its
averaging (NVML: instantaneous up to GA100; a 1 s average on later parts, which on the H200 lags the load by ~1 s),
not an energy counter: source vendor-estimate, so it is never ranked against counter figures.

`power()` is `nvmlDeviceGetPowerUsage` too, vendor-estimate for the same reason.

Device names: "cuda:N" is the NVML index, the order of Hardware.gpus (PCI bus order). CUDA's own order (and
CUDA_VISIBLE_DEVICES) can differ; a backend that knows its torch device can pass "cuda:GPU-<uuid>"
(torch.cuda.get_device_properties(i).uuid) to be exact.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Protocol

from farm.core.energy import Energy, EnergyScope, EnergySource, Power
from farm_agent.power import Clock, EnergyWindow, Sleep, UnavailableMeter

log = logging.getLogger("farm.agent.power.nvml")

POLL_S = 0.002  # how often the counter is read while waiting for a step edge
CHAIN_S = 1.0  # a window opened this soon after the last one's end starts at that end's edge
WIDE_EDGE_S = 0.005  # a half-bracket wider than this is named in the window's note
ALIGN_TIMEOUT_S = 0.12  # one 100 ms step and some slack
SAMPLE_PERIOD_S = 0.05  # power samples in the no-counter fallback

# Waits on `stop` for up to `seconds`; True when stop was set. Tests pass a fake that moves a fake clock instead.
Waiter = Callable[[threading.Event, float], bool]


class NvmlEnergyApi(Protocol):
    """The part of pynvml used here; tests pass a fake that replays a recording."""

    @property
    def NVMLError(self) -> type[Exception]: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .used, .total in bytes


def _event_wait(stop: threading.Event, seconds: float) -> bool:
    return stop.wait(seconds)


def trapezoid_joules(samples: Sequence[tuple[float, float]]) -> float:
    """Joules from (seconds, watts) samples, in time order, by the trapezoid rule."""
    return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(samples, samples[1:], strict=False))


class _NvmlDevice:
    """An NVML session on one device: nvmlInit when opened, nvmlShutdown when closed (NVML counts the inits)."""

    def __init__(self, nvml: NvmlEnergyApi, handle: Any, device: str) -> None:
        self.nvml, self.handle, self.device = nvml, handle, device
        self._open = True

    def power_watts(self) -> float | None:
        try:
            return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
        except self.nvml.NVMLError as exc:
            log.debug("%s: nvmlDeviceGetPowerUsage failed: %s", self.device, exc)
            return None

    def memory_bytes(self) -> tuple[int, int] | None:
        """The device's memory in use and in all, in bytes; None when NVML cannot say."""
        try:
            info = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
            return int(info.used), int(info.total)
        except self.nvml.NVMLError as exc:
            log.debug("%s: nvmlDeviceGetMemoryInfo failed: %s", self.device, exc)
            return None

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as exc:
                log.debug("nvmlShutdown: %s", exc)


def _done(edge: tuple[int, float, float | None]) -> Future[tuple[int, float, float | None]]:
    found: Future[tuple[int, float, float | None]] = Future()
    found.set_result(edge)
    return found


class NvmlCounterMeter:
    """NVML's total-energy counter, each window aligned to counter step edges (see the module docstring)."""

    source = EnergySource.COUNTER
    scope = EnergyScope.DEVICE
    available = True

    def __init__(
        self,
        nvml: NvmlEnergyApi,
        handle: Any,
        device: str,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
        align: bool = True,
        poll_s: float = POLL_S,
        align_timeout_s: float = ALIGN_TIMEOUT_S,
        reason: str = "",
    ) -> None:
        self._dev = _NvmlDevice(nvml, handle, device)
        self.device, self.reason = device, reason
        self._clock, self._sleep = clock, sleep
        self.align, self.poll_s, self.align_timeout_s = align, poll_s, align_timeout_s
        self._step_s: float | None = None
        self.defer = False  # find each window's end edge in a thread (a shard worker's meter): see the docstring
        self._last_end: Future[tuple[int, float, float | None]] | None = None  # the last window's end edge
        self._last_end_at = 0.0  # when that window's block ended
        self._finder: ThreadPoolExecutor | None = None

    @property
    def step_s(self) -> float:
        """How often the counter steps, measured once: the time between two consecutive step edges (waits up to two
        steps). Where it does not step within align_timeout_s, align_timeout_s: no finer than that can be told."""
        if self._step_s is None:
            _, first, first_error = self._edge()
            _, second, second_error = self._edge() if first_error is not None else (0, 0.0, None)
            aligned = first_error is not None and second_error is not None
            self._step_s = second - first if aligned else self.align_timeout_s
        return self._step_s

    def _read(self) -> tuple[int, float]:
        """(mJ, when): the counter, and the middle of the call that read it."""
        before = self._clock()
        value = int(self._dev.nvml.nvmlDeviceGetTotalEnergyConsumption(self._dev.handle))
        return value, (before + self._clock()) / 2

    def _edge(self) -> tuple[int, float, float | None]:
        """(mJ, when, half-bracket): the counter just after it stepped, the moment of the step and how far off that
        moment can be; where it did not step within align_timeout_s (or align is off), the last read, its time and
        None."""
        first, t_first = self._read()
        if not self.align:
            return first, t_first, None
        t_old = t_first
        while True:
            wait = self.poll_s - (self._clock() - t_old)
            if wait > 0:
                self._sleep(wait)
            value, t = self._read()
            if value != first:
                return value, (t_old + t) / 2, (t - t_old) / 2
            if t - t_first >= self.align_timeout_s:
                return value, t, None
            t_old = t

    @contextmanager
    def window(self) -> Iterator[EnergyWindow]:
        w = EnergyWindow()
        start = self._last_end if self._last_end is not None and self._clock() - self._last_end_at <= CHAIN_S \
            else _done(self._edge())
        began = self._clock()
        try:
            yield w
        finally:
            ended = self._clock()
            if self.defer:
                self._finder = self._finder or ThreadPoolExecutor(1, thread_name_prefix="farm-nvml-edge")
                end = self._finder.submit(self._edge)
            else:
                end = _done(self._edge())
            self._last_end, self._last_end_at = end, ended
            w.close_later(lambda: self._figure(start.result(), end.result()), ended - began)

    def _figure(self, start: tuple[int, float, float | None], end: tuple[int, float, float | None]
                ) -> tuple[Energy | None, str]:
        """A window's energy between its two edges, and its note."""
        (start_mj, start_t, start_error), (end_mj, end_t, end_error) = start, end
        notes = []
        if self.align and (start_error is None or end_error is None):
            notes.append(f"counter did not step within {self.align_timeout_s * 1000:.0f} ms: not aligned")
        widest = max(start_error or 0.0, end_error or 0.0)
        if widest > WIDE_EDGE_S:
            notes.append(f"a step edge known only to +-{widest * 1000:.0f} ms (a slow NVML read)")
        energy = None
        if end_mj < start_mj:  # the driver reloaded: the counter restarts from zero
            notes.append(f"counter went backwards ({start_mj} -> {end_mj} mJ): not measured")
        else:
            energy = Energy(joules=(end_mj - start_mj) / 1000.0, seconds=max(0.0, end_t - start_t),
                            source=self.source, scope=self.scope)
        return energy, "; ".join(notes)

    def power(self) -> Power | None:
        watts = self._dev.power_watts()
        return None if watts is None else Power(watts=watts, source=EnergySource.VENDOR_ESTIMATE, scope=self.scope)

    def memory(self) -> tuple[int, int] | None:
        return self._dev.memory_bytes()

    def close(self) -> None:
        self._dev.close()

    def __repr__(self) -> str:
        return f"NvmlCounterMeter({self.device!r})"


class NvmlPowerMeter:
    """Where the counter is missing: NVML power samples integrated over the window (vendor-estimate)."""

    source = EnergySource.VENDOR_ESTIMATE
    scope = EnergyScope.DEVICE
    available = True

    def __init__(
        self,
        nvml: NvmlEnergyApi,
        handle: Any,
        device: str,
        *,
        clock: Clock = time.monotonic,
        wait: Waiter = _event_wait,
        period_s: float = SAMPLE_PERIOD_S,
        reason: str = "",
    ) -> None:
        self._dev = _NvmlDevice(nvml, handle, device)
        self.device, self.reason = device, reason
        self._clock, self._wait, self.period_s = clock, wait, period_s

    @property
    def step_s(self) -> float:
        """The sampling period: the integral moves no finer (the driver's own averaging aside)."""
        return self.period_s

    def _sample(self, into: list[tuple[float, float]]) -> None:
        watts = self._dev.power_watts()
        if watts is not None:
            into.append((self._clock(), watts))

    def _sampling(self, into: list[tuple[float, float]], stop: threading.Event) -> None:
        while not self._wait(stop, self.period_s):
            self._sample(into)

    @contextmanager
    def window(self) -> Iterator[EnergyWindow]:
        w = EnergyWindow()
        samples: list[tuple[float, float]] = []
        stop = threading.Event()
        began = self._clock()
        self._sample(samples)
        sampler = threading.Thread(target=self._sampling, args=(samples, stop), name=f"farm-power-{self.device}",
                                   daemon=True)
        sampler.start()
        try:
            yield w
        finally:
            stop.set()
            sampler.join()
            ended = self._clock()
            self._sample(samples)
            if len(samples) < 2:
                w.close(None, ended - began, "fewer than two NVML power samples: not measured")
            else:
                energy = Energy(joules=trapezoid_joules(samples), seconds=samples[-1][0] - samples[0][0],
                                source=self.source, scope=self.scope)
                w.close(energy, ended - began, f"{len(samples)} NVML power samples integrated")

    def power(self) -> Power | None:
        watts = self._dev.power_watts()
        return None if watts is None else Power(watts=watts, source=self.source, scope=self.scope)

    def memory(self) -> tuple[int, int] | None:
        return self._dev.memory_bytes()

    def close(self) -> None:
        self._dev.close()

    def __repr__(self) -> str:
        return f"NvmlPowerMeter({self.device!r})"


def load_pynvml() -> tuple[NvmlEnergyApi | None, str]:
    """pynvml, or None and why not."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"nvidia-ml-py not installed ({exc})"
    return pynvml, ""


def open_nvml_meter(
    which: str,
    *,
    nvml: NvmlEnergyApi | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    wait: Waiter = _event_wait,
) -> NvmlCounterMeter | NvmlPowerMeter | UnavailableMeter:
    """A meter for NVML device `which` (an index, "0", or a UUID, "GPU-..."); UnavailableMeter with the reason when
    NVML, the device or both of its readings are missing."""
    device = f"cuda:{which}"

    def unavailable(why: str) -> UnavailableMeter:
        log.debug("%s power: %s", device, why)  # the agent logs meter.reason once it has registered
        return UnavailableMeter(device, why, EnergySource.COUNTER, EnergyScope.DEVICE)

    if nvml is None:
        nvml, why = load_pynvml()
        if nvml is None:
            return unavailable(why)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return unavailable(f"NVML: {exc}")
    try:
        handle = (nvml.nvmlDeviceGetHandleByUUID(which) if which.startswith(("GPU-", "MIG-"))
                  else nvml.nvmlDeviceGetHandleByIndex(int(which)))
    except (nvml.NVMLError, ValueError) as exc:
        _shutdown(nvml)
        return unavailable(f"NVML has no device {which!r}: {exc}")
    try:
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except nvml.NVMLError as exc:
        no_counter = f"NVML total-energy counter not supported ({exc}): integrating nvmlDeviceGetPowerUsage samples"
    else:
        return NvmlCounterMeter(nvml, handle, device, clock=clock, sleep=sleep)
    try:
        nvml.nvmlDeviceGetPowerUsage(handle)
    except nvml.NVMLError as exc:
        _shutdown(nvml)
        return unavailable(f"NVML gives neither the energy counter nor power usage ({exc})")
    log.debug("%s power: %s", device, no_counter)
    return NvmlPowerMeter(nvml, handle, device, clock=clock, wait=wait, reason=no_counter)


def _shutdown(nvml: NvmlEnergyApi) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as exc:
        log.debug("nvmlShutdown: %s", exc)
