"""macOS signals that the owner needs the Mac: recent input, running on battery, thermal pressure, and apps that
said the user is active (video, presentations). Each is a parser of a tool's output plus a reader that runs the tool;
`mac_busy_reason` turns them into the idle policy's verdict ("" while the Mac may work for Farm).

    signals = read_mac_signals()          # runs ioreg, pmset and notifyutil (about 50 ms in all)
    why = mac_busy_reason(signals)        # "" or e.g. "on battery (63%)"

The tools, and why each:
- `ioreg -c IOHIDSystem`: the IOHIDSystem entry's "HIDIdleTime", nanoseconds since the last keyboard, mouse or
  trackpad event (what screen savers use). No permission needed.
- `pmset -g batt`: "Now drawing from 'AC Power'" or 'Battery Power', and the battery's percent when there is one.
- `notifyutil -g com.apple.system.thermalpressurelevel`: the system's thermal pressure level, as
  OSThermalNotification.h numbers it (0 nominal, 1 moderate, 2 heavy, 3 trapping, 4 sleeping); the same level
  ProcessInfo.thermalState reports. `pmset -g therm` is read as well: "CPU_Speed_Limit = N" below 100 means the
  CPUs are throttled (it prints only notes when nothing was recorded, as on most Apple Silicon Macs).
- `pmset -g assertions`: "UserIsActive 1" (the HID system holds it for a while after input) and
  "PreventUserIdleDisplaySleep 1" (video playing, a presentation), with the processes that hold them.

Farm itself may hold PreventUserIdleSystemSleep while it works: that one is not a sign of the owner.
Parsers are pure and tested on recordings (tests/fixtures/apple); readers need macOS.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TypeVar

from farm_agent.daemon.hardware import Runner, run_command

HID_IDLE_ARGS = ("ioreg", "-c", "IOHIDSystem")
BATTERY_ARGS = ("pmset", "-g", "batt")
THERMAL_PRESSURE_ARGS = ("notifyutil", "-g", "com.apple.system.thermalpressurelevel")
THERM_ARGS = ("pmset", "-g", "therm")
ASSERTIONS_ARGS = ("pmset", "-g", "assertions")

T = TypeVar("T")

# Assertions that say a person is using the Mac. PreventUserIdleSystemSleep is not one: background work
# (Farm's own shards, backups, downloads) holds it.
USER_ASSERTIONS = ("UserIsActive", "PreventUserIdleDisplaySleep")


class ThermalPressure(IntEnum):
    """OSThermalNotification.h's kOSThermalPressureLevel* values."""

    NOMINAL = 0
    MODERATE = 1
    HEAVY = 2
    TRAPPING = 3
    SLEEPING = 4


# --- parsers of recorded output ---

_HID_IDLE = re.compile(r'"HIDIdleTime"\s*=\s*(\d+)')


def parse_hid_idle_seconds(text: str) -> float | None:
    """Seconds since the last input event from `ioreg -c IOHIDSystem` output; None when it has no HIDIdleTime."""
    match = _HID_IDLE.search(text)
    return int(match.group(1)) / 1e9 if match else None


@dataclass(frozen=True)
class PowerSource:
    on_ac: bool
    battery_percent: int | None = None  # None on a Mac without a battery
    battery_state: str = ""  # charged, charging, discharging, "AC attached; not charging", ...


_SOURCE = re.compile(r"Now drawing from '([^']+)'")
_BATTERY = re.compile(r"\t(\d+)%;\s*([^;]+);")


def parse_power_source(text: str) -> PowerSource | None:
    """`pmset -g batt` output as a PowerSource; None when it names no source."""
    source = _SOURCE.search(text)
    if not source:
        return None
    battery = _BATTERY.search(text)
    return PowerSource(
        on_ac=source.group(1) == "AC Power",
        battery_percent=int(battery.group(1)) if battery else None,
        battery_state=battery.group(2).strip() if battery else "",
    )


_PRESSURE = re.compile(r"com\.apple\.system\.thermalpressurelevel\s+(\d+)")


def parse_thermal_pressure(text: str) -> ThermalPressure | None:
    """`notifyutil -g com.apple.system.thermalpressurelevel` output as a level; None when unreadable."""
    match = _PRESSURE.search(text)
    if not match:
        return None
    value = int(match.group(1))
    return ThermalPressure(min(value, ThermalPressure.SLEEPING))


_SPEED_LIMIT = re.compile(r"CPU_Speed_Limit\s*=\s*(\d+)")


def parse_cpu_speed_limit(text: str) -> int | None:
    """The CPU speed limit in percent from `pmset -g therm` (100: not throttled); None when none was recorded."""
    matches = _SPEED_LIMIT.findall(text)
    return int(matches[-1]) if matches else None  # the last notification is the current one


@dataclass(frozen=True)
class AssertionHolder:
    pid: int
    process: str
    kind: str  # the assertion type, e.g. PreventUserIdleDisplaySleep
    name: str  # what the holder called it, e.g. "Video Wake Lock"


@dataclass(frozen=True)
class Assertions:
    system: dict[str, int]  # system-wide status: assertion type -> 0 or 1
    holders: tuple[AssertionHolder, ...] = ()


_STATUS_LINE = re.compile(r"^\s+(\w+)\s+(\d+)\s*$")
_HOLDER_LINE = re.compile(r'^\s+pid (\d+)\((.*?)\): \[0x[0-9a-fA-F]+\] [\d:]+ (\w+) named: "(.*)"')


def parse_assertions(text: str) -> Assertions:
    """`pmset -g assertions` output: the system-wide status and who holds what."""
    system: dict[str, int] = {}
    holders = []
    section = ""
    for line in text.splitlines():
        if line.startswith("Assertion status system-wide"):
            section = "system"
        elif line.startswith("Listed by owning process"):
            section = "holders"
        elif line and not line[0].isspace():
            section = ""  # "Kernel Assertions:", "Idle sleep preventers:", the timestamp
        elif section == "system" and (status := _STATUS_LINE.match(line)):
            system[status.group(1)] = int(status.group(2))
        elif section == "holders" and (holder := _HOLDER_LINE.match(line)):
            holders.append(AssertionHolder(int(holder.group(1)), holder.group(2), holder.group(3), holder.group(4)))
    return Assertions(system=system, holders=tuple(holders))


# --- the verdict ---


@dataclass(frozen=True)
class MacSignals:
    """What was read; None where a tool could not be run or said nothing (then that rule does not judge)."""

    idle_seconds: float | None = None
    power: PowerSource | None = None
    thermal: ThermalPressure | None = None
    cpu_speed_limit: int | None = None
    assertions: Assertions | None = None
    errors: tuple[str, ...] = field(default=())  # tools that failed, and how


@dataclass(frozen=True)
class MacIdleRules:
    min_idle_seconds: float = 300.0  # no input for 5 minutes
    allow_battery: bool = False  # a Mac on battery is its owner's, not the farm's
    max_thermal: ThermalPressure = ThermalPressure.NOMINAL  # any pressure: back off
    min_cpu_speed_limit: int = 100  # any throttling: back off


def mac_busy_reason(signals: MacSignals, rules: MacIdleRules = MacIdleRules()) -> str:
    """Why the owner needs the Mac now, or "" when Farm may use it (rules whose signal is missing do not judge)."""
    reasons = []
    if signals.idle_seconds is not None and signals.idle_seconds < rules.min_idle_seconds:
        reasons.append(f"input {signals.idle_seconds:.0f} s ago (idle after {rules.min_idle_seconds:.0f} s)")
    if signals.power is not None and not signals.power.on_ac and not rules.allow_battery:
        percent = f" ({signals.power.battery_percent}%)" if signals.power.battery_percent is not None else ""
        reasons.append(f"on battery{percent}")
    if signals.thermal is not None and signals.thermal > rules.max_thermal:
        reasons.append(f"thermal pressure {signals.thermal.name.lower()}")
    if signals.cpu_speed_limit is not None and signals.cpu_speed_limit < rules.min_cpu_speed_limit:
        reasons.append(f"CPU throttled to {signals.cpu_speed_limit}%")
    if signals.assertions is not None:
        held = [kind for kind in USER_ASSERTIONS if signals.assertions.system.get(kind)]
        if held:
            by = sorted({f"{h.process}: {h.name}" for h in signals.assertions.holders
                         if h.kind in held and h.kind != "UserIsActive"})
            reasons.append(f"user activity ({', '.join(held)}" + (f"; {'; '.join(by)}" if by else "") + ")")
    return "; ".join(reasons)


# --- readers (macOS) ---


def _read(run: Runner, args: Sequence[str], parse: Callable[[str], T | None], errors: list[str]) -> T | None:
    try:
        return parse(run(args))
    except (OSError, subprocess.SubprocessError) as exc:
        errors.append(f"{args[0]} {' '.join(args[1:])}: {exc}")
        return None


def read_mac_signals(run: Runner = run_command) -> MacSignals:
    """Every signal, read now; a tool that fails leaves its signal None and says so in `errors`."""
    errors: list[str] = []
    idle = _read(run, HID_IDLE_ARGS, parse_hid_idle_seconds, errors)
    power = _read(run, BATTERY_ARGS, parse_power_source, errors)
    thermal = _read(run, THERMAL_PRESSURE_ARGS, parse_thermal_pressure, errors)
    speed = _read(run, THERM_ARGS, parse_cpu_speed_limit, errors)
    assertions = _read(run, ASSERTIONS_ARGS, parse_assertions, errors)
    return MacSignals(idle_seconds=idle, power=power, thermal=thermal, cpu_speed_limit=speed, assertions=assertions,
                      errors=tuple(errors))
