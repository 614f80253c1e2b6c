"""The idle policy: whether the device's owner needs it now, said as a reason (empty while the device is idle).

The agent reports the verdict with every heartbeat and the scheduler gives a busy node no new shards. The rule here
everywhere is the owner's CPU load, the one signal every platform has: the machine's CPU use minus Farm's own (the
agent and the processes under it: its Ray node and the workers running shards), averaged over a short window so
that a burst does not flap the node in and out. On macOS the owner's own signals join it (farm_agent.daemon.idle_mac:
seconds since the last input, battery, thermal pressure, user-activity assertions), read every few beats since each
read runs a few system tools. A busy file (AgentSettings.busy_file), while it exists, makes the node busy outright:
an operator's switch, and the tests' honest way to make an owner busy.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

import psutil

# Heartbeats averaged: at the default 2 s interval the owner's load is judged over the last 10 s.
WINDOW = 5
# Heartbeats between reads of the platform's owner signals (ioreg, pmset, ...: tens of ms each).
OWNER_SIGNALS_EVERY = 5


def mac_owner_signals() -> str:
    from farm_agent.daemon.idle_mac import mac_busy_reason, read_mac_signals

    return mac_busy_reason(read_mac_signals())


def farm_cpu_percent(root: psutil.Process, known: dict[int, psutil.Process]) -> float:
    """CPU used by `root` and everything under it since the previous call, in percent of one core.

    psutil measures a process's CPU between two calls on the same Process object, so they are kept in `known`
    (a new process counts from its second reading on: a shard's worker lives for many heartbeats).
    """
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    alive = {}
    total = 0.0
    for process in processes:
        process = known.get(process.pid, process)
        try:
            total += process.cpu_percent(interval=None)
        except psutil.Error:
            continue
        alive[process.pid] = process
    known.clear()
    known.update(alive)
    return total


class MachineCpu:
    """The whole machine's CPU use since the previous call, in percent, from its own CPU-time deltas.

    Not psutil.cpu_percent(interval=None): that keeps one "previous reading" per thread, shared with every other
    caller on the thread (the CPU power estimate is one), so two callers would each see a sliver of an interval.
    """

    def __init__(self) -> None:
        self._last = self._times()

    @staticmethod
    def _times() -> tuple[float, float]:
        t = psutil.cpu_times()
        return sum(t), t.idle + getattr(t, "iowait", 0.0)

    def __call__(self) -> float:
        total, idle = self._times()
        (total0, idle0), self._last = self._last, (total, idle)
        elapsed = total - total0
        return 0.0 if elapsed <= 0 else min(max(100.0 * (1 - (idle - idle0) / elapsed), 0.0), 100.0)


class IdlePolicy:
    """`busy()` once per heartbeat: why the owner needs the machine now, or "" when Farm may use it."""

    def __init__(
        self,
        max_foreign_cpu: float,
        cpu_percent: Callable[[], float] | None = None,
        farm_percent: Callable[[], float] | None = None,
        cores: int | None = None,
        owner_signals: Callable[[], str] | None = mac_owner_signals if sys.platform == "darwin" else None,
        busy_file: Path | None = None,
    ) -> None:
        """`max_foreign_cpu`: the owner's share of the whole machine's CPU (percent) above which it is busy;
        100 turns the rule off (several agents sharing one host would otherwise see each other as the owner)."""
        self.max_foreign_cpu = max_foreign_cpu
        self.cores = cores or psutil.cpu_count() or 1
        self._cpu_percent = cpu_percent or MachineCpu()
        self.machine_percent = 0.0  # the last reading, which the heartbeat reports as the node's CPU use
        self.farm_percent = 0.0  # Farm's own share of it (the rest is the owner's), reported beside it
        if farm_percent is None:
            root, known = psutil.Process(), dict[int, psutil.Process]()
            farm_percent = lambda: farm_cpu_percent(root, known)  # noqa: E731
        self._farm_percent = farm_percent
        self._foreign: deque[float] = deque(maxlen=WINDOW)
        self._owner_signals = owner_signals
        self._owner = ""  # the platform signals' last verdict
        self._beats = 0
        self.busy_file = busy_file

    def busy(self) -> str:
        if self._owner_signals is not None and self._beats % OWNER_SIGNALS_EVERY == 0:
            self._owner = self._owner_signals()
        self._beats += 1
        return "; ".join(reason for reason in (self._cpu_load(), self._owner, self._busy_file()) if reason)

    def _busy_file(self) -> str:
        """The busy file's reason while it exists: its first line, else that it exists."""
        if self.busy_file is None:
            return ""
        try:
            text = self.busy_file.read_text(errors="replace").strip()
        except FileNotFoundError:
            return ""
        except OSError as exc:  # there but unreadable: still the operator's "busy"
            return f"busy file {self.busy_file} ({exc.strerror})"
        return text.splitlines()[0][:200] if text else f"busy file {self.busy_file}"

    def _cpu_load(self) -> str:
        self.machine_percent = machine = self._cpu_percent()  # percent of the whole machine
        # percent of one core → of the whole machine; read every beat, for the dashboard's owner/farm split too
        self.farm_percent = farm = min(self._farm_percent() / self.cores, machine)
        if self.max_foreign_cpu >= 100:
            return ""
        self._foreign.append(max(machine - farm, 0.0))
        foreign = sum(self._foreign) / len(self._foreign)
        if len(self._foreign) == WINDOW and foreign > self.max_foreign_cpu:
            return f"owner's CPU load {foreign:.0f}% > {self.max_foreign_cpu:.0f}%"
        return ""
