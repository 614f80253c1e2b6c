"""Apple Silicon: the energy of the Neural Engine, the GPU, the CPU or the whole SoC, from macOS's own model.

macOS exposes no energy sensor to programs; IOReport's "Energy Model" group estimates each block's energy from its
activity, frequency and voltage, and every tool reads that (powermetrics' man page: "estimated and may be
inaccurate"). So every figure here is source vendor-estimate. Three readers, best first:

1. zeus-apple-silicon (PyPI; see the package docstring for why it is used): IOReport's cumulative counters in mJ,
   sudoless. A window is two reads and a subtraction, like NVML; resolution 1 mJ, no steps to align to.
2. macmon (`brew install macmon`; sudoless): `macmon pipe -i 100` prints one JSON line per 100 ms sample with the
   sample's average `cpu_power`, `gpu_power`, `ane_power` and `all_power` (CPU + GPU + ANE) in watts and an RFC 3339
   `timestamp` taken when the sample ended. Development builds nest them instead as `power: {cpu, gpu, ane, package}`;
   both are read.
3. powermetrics (root only; the agent is not root, so this is for agents installed as a LaunchDaemon):
   `powermetrics --samplers cpu_power,gpu_power,ane_power -i 100 -b 1 -a 0` prints a block per sample:
   "*** Sampled system activity (DATE) (101.83ms elapsed) ***" then "CPU Power: 954 mW", "GPU Power: 28 mW",
   "ANE Power: 0 mW", "Combined Power (CPU + GPU + ANE): 983 mW".
The two streams are read by a background thread; each sample is the average over the interval that ended at its
time, so a window integrates every sample over the part of its interval that falls inside the window (a step
function, not a trapezoid: the samples are averages over intervals, not readings at instants). Where the samples do
not reach an end of the window, the uncovered part is billed at the covered part's average power, and the window says
how much it covered.

Scope, chosen per device: "ane" is the Neural Engine alone and "mps" the GPU alone (scope device: the accelerator's
own block, as NVML's figure is the board's), "cpu" the CPU clusters and "soc" CPU + GPU + ANE (scope package). DRAM
is in none of them (zeus-apple-silicon and macmon report it apart). A shard on the ANE also keeps CPU cores busy;
a caller that wants to bill that measures "soc".

On any other OS every Apple device is an UnavailableMeter that says so.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from farm.core.energy import Energy, EnergyScope, EnergySource, Power
from farm_agent.power import Clock, EnergyWindow, UnavailableMeter

log = logging.getLogger("farm.agent.power.apple")

SAMPLE_MS = 100
COMPONENT_OF_DEVICE = {"ane": "ane", "mps": "gpu", "cpu": "cpu", "soc": "soc"}
SCOPE_OF_COMPONENT = {"ane": EnergyScope.DEVICE, "gpu": EnergyScope.DEVICE, "cpu": EnergyScope.PACKAGE,
                      "soc": EnergyScope.PACKAGE}

MACMON_ARGS = ("macmon", "pipe", "-i", str(SAMPLE_MS))
# -b 1: line-buffered through the pipe; -a 0: no "poweravg" summaries between the samples.
POWERMETRICS_ARGS = ("powermetrics", "--samplers", "cpu_power,gpu_power,ane_power", "-i", str(SAMPLE_MS), "-b", "1",
                     "-a", "0")

# --- parsers of recorded output ---


def parse_macmon_line(line: str) -> tuple[float | None, dict[str, float]] | None:
    """(timestamp in Unix seconds or None, watts by component) from one `macmon pipe` line; None for a line that is
    not a sample."""
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    watts: dict[str, float] = {}
    nested = doc.get("power")
    if isinstance(nested, dict):  # development builds: power: {package, cpu, gpu, ane, ram, ...}
        pairs = {"cpu": nested.get("cpu"), "gpu": nested.get("gpu"), "ane": nested.get("ane"),
                 "soc": nested.get("package")}
    else:
        pairs = {"cpu": doc.get("cpu_power"), "gpu": doc.get("gpu_power"), "ane": doc.get("ane_power"),
                 "soc": doc.get("all_power")}
    for name, value in pairs.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            watts[name] = max(0.0, float(value))
    if not watts:
        return None
    if "soc" not in watts and {"cpu", "gpu", "ane"} <= watts.keys():
        watts["soc"] = watts["cpu"] + watts["gpu"] + watts["ane"]
    stamp = None
    if isinstance(doc.get("timestamp"), str):
        try:
            stamp = datetime.fromisoformat(doc["timestamp"]).timestamp()
        except ValueError:
            stamp = None
    return stamp, watts


PM_HEADER = re.compile(r"^\*\*\* Sampled system activity .*\((\d+(?:\.\d+)?)\s*ms elapsed\)")
PM_LINE = re.compile(r"^(CPU|GPU|ANE|Package|Combined) Power(?: \(CPU \+ GPU \+ ANE\))?:\s*(\d+(?:\.\d+)?)\s*mW")
PM_NAMES = {"CPU": "cpu", "GPU": "gpu", "ANE": "ane", "Package": "soc", "Combined": "soc"}


def parse_powermetrics_block(lines: Iterable[str]) -> dict[str, float]:
    """Watts by component from the lines of one powermetrics sample (the first of repeated lines wins: "GPU Power"
    appears in the processor and the GPU sections)."""
    watts: dict[str, float] = {}
    for line in lines:
        match = PM_LINE.match(line.strip())
        if match:
            watts.setdefault(PM_NAMES[match.group(1)], float(match.group(2)) / 1000.0)
    if "soc" not in watts and {"cpu", "gpu", "ane"} <= watts.keys():
        watts["soc"] = watts["cpu"] + watts["gpu"] + watts["ane"]
    return watts


def parse_powermetrics(text: str) -> list[tuple[float, dict[str, float]]]:
    """(elapsed seconds, watts by component) for each sample in a powermetrics text output."""
    samples = []
    elapsed: float | None = None
    block: list[str] = []
    for line in [*text.splitlines(), None]:
        header = PM_HEADER.match(line) if line is not None else None
        if line is None or header:
            if elapsed is not None:
                watts = parse_powermetrics_block(block)
                if watts:
                    samples.append((elapsed, watts))
            elapsed, block = (float(header.group(1)) / 1000.0 if header else None), []
        else:
            block.append(line)
    return samples


@dataclass(frozen=True)
class AppleSample:
    end: float  # when the sample's interval ended, on the meter's clock
    seconds: float  # the interval's length
    watts: Mapping[str, float]  # its average power by component


def integrate(samples: Iterable[AppleSample], start: float, end: float, component: str) -> tuple[float, float]:
    """(joules, seconds covered): each sample's average power over the part of its interval inside [start, end]."""
    joules = covered = 0.0
    for s in samples:
        lo, hi = max(start, s.end - s.seconds), min(end, s.end)
        if hi > lo and component in s.watts:
            joules += s.watts[component] * (hi - lo)
            covered += hi - lo
    return joules, covered


# --- the readers ---


class ToolProcess(Protocol):
    """What is used of a subprocess.Popen; tests pass a fake whose stdout replays a recording."""

    @property
    def stdout(self) -> Iterable[str] | None: ...

    def terminate(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


Spawn = Callable[[Sequence[str]], ToolProcess]


def popen(args: Sequence[str]) -> ToolProcess:
    return subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)


class SampleStream:
    """A sampling tool run in the background (macmon or powermetrics), its samples kept while windows need them."""

    def __init__(self, tool: str, args: Sequence[str], *, spawn: Spawn = popen, clock: Clock = time.time,
                 interval_s: float = SAMPLE_MS / 1000) -> None:
        self.tool, self.interval_s, self._clock = tool, interval_s, clock
        self._samples: list[AppleSample] = []
        self._open_starts: list[float] = []  # start times of open windows: their samples are kept
        self._cond = threading.Condition()
        self.ended = False  # the tool's output ended (it exited or failed to start)
        self._proc = spawn(args)
        self._thread = threading.Thread(target=self._read, name=f"farm-power-{tool}", daemon=True)
        self._thread.start()

    def _add(self, sample: AppleSample) -> None:
        with self._cond:
            self._samples.append(sample)
            keep_from = min(self._open_starts, default=sample.end - 10 * self.interval_s) - 2 * self.interval_s
            while self._samples and self._samples[0].end < keep_from:
                self._samples.pop(0)
            self._cond.notify_all()

    def _read(self) -> None:
        try:
            lines = self._proc.stdout or ()
            if self.tool == "macmon":
                self._read_macmon(lines)
            else:
                self._read_powermetrics(lines)
        except (OSError, ValueError) as exc:
            log.warning("%s stopped: %s", self.tool, exc)
        finally:
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    def _read_macmon(self, lines: Iterable[str]) -> None:
        last_end: float | None = None
        for line in lines:
            parsed = parse_macmon_line(line)
            if parsed is None:
                continue
            stamp, watts = parsed
            end = stamp if stamp is not None else self._clock()
            gap = end - last_end if last_end is not None else self.interval_s
            seconds = gap if 0 < gap < 3 * self.interval_s else self.interval_s  # a gap: the tool stalled
            self._add(AppleSample(end=end, seconds=seconds, watts=watts))
            last_end = end

    def _read_powermetrics(self, lines: Iterable[str]) -> None:
        # A block is complete when the next header (or the end) arrives. Its header is printed when its interval
        # ends, so the first header's arrival anchors the timeline, and each later sample ends `elapsed` after the
        # one before (steadier than arrival times through a pipe).
        end: float | None = None
        elapsed: float | None = None
        block: list[str] = []

        def flush() -> None:
            if end is not None and elapsed is not None:
                watts = parse_powermetrics_block(block)
                if watts:
                    self._add(AppleSample(end=end, seconds=elapsed, watts=watts))

        for line in lines:
            header = PM_HEADER.match(line)
            if not header:
                block.append(line)
                continue
            flush()
            elapsed, block = float(header.group(1)) / 1000.0, []
            end = self._clock() if end is None else end + elapsed
        flush()

    def begin(self, start: float) -> None:
        with self._cond:
            self._open_starts.append(start)

    def finish(self, start: float, end: float, timeout: float) -> list[AppleSample]:
        """The samples overlapping [start, end], once one reaches `end` (or the timeout passes, or the tool ended)."""
        with self._cond:
            self._cond.wait_for(lambda: self.ended or (self._samples and self._samples[-1].end >= end),
                                timeout=timeout)
            self._open_starts.remove(start)
            return [s for s in self._samples if s.end > start and s.end - s.seconds < end]

    def latest(self) -> AppleSample | None:
        with self._cond:
            return self._samples[-1] if self._samples else None

    def close(self) -> None:
        try:
            self._proc.terminate()
            self._proc.wait(timeout=2)
        except (OSError, subprocess.SubprocessError) as exc:
            log.debug("%s: %s", self.tool, exc)


class ZeusCounters:
    """zeus_apple_silicon's AppleEnergyMonitor: IOReport's cumulative energy in mJ."""

    FIELDS = {"cpu": ("cpu_total_mj",), "gpu": ("gpu_mj",), "ane": ("ane_mj",),
              "soc": ("cpu_total_mj", "gpu_mj", "ane_mj")}

    tool = "zeus-apple-silicon"

    def __init__(self, module: Any) -> None:
        self._monitor = module.AppleEnergyMonitor()

    def read_mj(self, component: str) -> int | None:
        """The cumulative mJ of a component, or None where this chip does not report it."""
        metrics = self._monitor.get_cumulative_energy()
        total = 0
        for name in self.FIELDS[component]:
            value = getattr(metrics, name, None)
            if value is None:
                return None
            total += int(value)
        return total

    def close(self) -> None:
        pass


class AppleMeter:
    """One Apple block (ane, gpu, cpu, soc) through one of the readers; source vendor-estimate."""

    source = EnergySource.VENDOR_ESTIMATE
    available = True

    def __init__(self, device: str, reader: ZeusCounters | SampleStream, *, clock: Clock = time.time,
                 reason: str = "") -> None:
        self.device, self.reason = device, reason
        self.component = COMPONENT_OF_DEVICE[device]
        self.scope = SCOPE_OF_COMPONENT[self.component]
        self.reader = reader
        self._clock = clock
        self._last: tuple[float, int] | None = None  # for power() from counters: the previous reading

    @property
    def step_s(self) -> float:
        """IOReport's counters: no step to speak of (1 mJ resolution); a tool's samples: its sampling interval."""
        return 0.0 if isinstance(self.reader, ZeusCounters) else self.reader.interval_s

    @contextmanager
    def window(self) -> Iterator[EnergyWindow]:
        if isinstance(self.reader, ZeusCounters):
            with self._counter_window(self.reader) as w:
                yield w
        else:
            with self._stream_window(self.reader) as w:
                yield w

    @contextmanager
    def _counter_window(self, counters: ZeusCounters) -> Iterator[EnergyWindow]:
        w = EnergyWindow()
        t0, mj0 = self._clock(), counters.read_mj(self.component)
        try:
            yield w
        finally:
            t1, mj1 = self._clock(), counters.read_mj(self.component)
            if mj0 is None or mj1 is None:
                w.close(None, t1 - t0, f"{counters.tool} reports no {self.component} energy on this chip")
            else:
                w.close(Energy(joules=max(0, mj1 - mj0) / 1000.0, seconds=t1 - t0, source=self.source,
                               scope=self.scope), t1 - t0, f"{counters.tool} IOReport counters")

    @contextmanager
    def _stream_window(self, stream: SampleStream) -> Iterator[EnergyWindow]:
        w = EnergyWindow()
        t0 = self._clock()
        stream.begin(t0)
        try:
            yield w
        finally:
            t1 = self._clock()
            samples = stream.finish(t0, t1, timeout=2 * stream.interval_s + 0.5)
            joules, covered = integrate(samples, t0, t1, self.component)
            span = t1 - t0
            if covered <= 0:
                w.close(None, span, f"no {stream.tool} samples for this window: not measured")
            else:
                note = f"{len(samples)} {stream.tool} samples"
                if covered < span * 0.999:
                    joules *= span / covered  # the uncovered part at the covered part's average power
                    note += f", covering {100 * covered / span:.0f}% of the window (the rest at their average)"
                w.close(Energy(joules=joules, seconds=span, source=self.source, scope=self.scope), span, note)

    def power(self) -> Power | None:
        if isinstance(self.reader, ZeusCounters):
            # The average since the previous power() call; None on the first call.
            t, mj = self._clock(), self.reader.read_mj(self.component)
            if mj is None:
                return None
            last = self._last
            if last is not None and t - last[0] < 0.01:
                return None
            self._last = (t, mj)
            if last is None:
                return None
            return Power(watts=max(0, mj - last[1]) / 1000.0 / (t - last[0]), source=self.source, scope=self.scope)
        sample = self.reader.latest()
        if sample is None or self._clock() - sample.end > 3 * self.reader.interval_s + 1.0:
            return None
        watts = sample.watts.get(self.component)
        return None if watts is None else Power(watts=watts, source=self.source, scope=self.scope)

    def close(self) -> None:
        self.reader.close()

    def __repr__(self) -> str:
        return f"AppleMeter({self.device!r}, {self.reader.tool})"


# --- the chooser ---


def load_zeus_apple_silicon() -> tuple[Any | None, str]:
    """The zeus_apple_silicon module, or None and why not."""
    try:
        import zeus_apple_silicon
    except ImportError as exc:
        return None, f"zeus-apple-silicon not installed ({exc})"
    return zeus_apple_silicon, ""


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass
class AppleTools:
    """What the Apple meter uses from the machine; tests replace each part."""

    load_zeus: Callable[[], tuple[Any | None, str]] = load_zeus_apple_silicon
    which: Callable[[str], str | None] = shutil.which
    spawn: Spawn = popen
    is_root: Callable[[], bool] = _is_root
    clock: Clock = field(default=time.time)  # Unix time: macmon stamps its samples with it


def open_apple_meter(device: str, *, system: str, tools: AppleTools | None = None) -> AppleMeter | UnavailableMeter:
    """The best Apple reader for `device` ("ane", "mps", "cpu", "soc"), or UnavailableMeter and why."""
    tools = tools or AppleTools()
    component = COMPONENT_OF_DEVICE[device]
    scope = SCOPE_OF_COMPONENT[component]

    def unavailable(why: str) -> UnavailableMeter:
        log.debug("%s power: %s", device, why)  # the agent logs meter.reason once it has registered
        return UnavailableMeter(device, why, EnergySource.VENDOR_ESTIMATE, scope)

    if system != "darwin":
        return unavailable(f"Apple Silicon power is read on macOS only, and this is {system or 'unknown'}")
    reasons = []
    module, why = tools.load_zeus()
    if module is not None:
        try:
            counters = ZeusCounters(module)
            if counters.read_mj(component) is not None:
                return AppleMeter(device, counters, clock=tools.clock)
            reasons.append(f"zeus-apple-silicon reports no {component} energy on this chip")
        except Exception as exc:  # a native extension: its errors are not ours to enumerate; say what it said
            reasons.append(f"zeus-apple-silicon failed: {exc!r}")
    else:
        reasons.append(why)
    candidates: tuple[tuple[str, Sequence[str], bool, str], ...] = (
        ("macmon", MACMON_ARGS, True, "macmon not on PATH (brew install macmon)"),
        ("powermetrics", POWERMETRICS_ARGS, tools.is_root(), "powermetrics needs root, and the agent is not root"),
    )
    for tool, args, usable, missing in candidates:
        if not (tools.which(tool) and usable):
            reasons.append(missing)
            continue
        try:
            stream = SampleStream(tool, args, spawn=tools.spawn, clock=tools.clock)
        except OSError as exc:
            reasons.append(f"{tool} did not start: {exc}")
            continue
        return AppleMeter(device, stream, clock=tools.clock, reason="; ".join([*reasons, f"sampling {tool}"]))
    return unavailable("; ".join(reasons))
