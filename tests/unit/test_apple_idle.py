"""macOS idle signals (farm_agent.daemon.idle_mac), parsed from recorded tool outputs; the live read needs a Mac."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

import pytest
from farm_agent.daemon.idle_mac import (
    ASSERTIONS_ARGS,
    BATTERY_ARGS,
    HID_IDLE_ARGS,
    THERM_ARGS,
    THERMAL_PRESSURE_ARGS,
    MacIdleRules,
    MacSignals,
    PowerSource,
    ThermalPressure,
    mac_busy_reason,
    parse_assertions,
    parse_cpu_speed_limit,
    parse_hid_idle_seconds,
    parse_power_source,
    parse_thermal_pressure,
    read_mac_signals,
)

from tests.conftest import FIXTURES

APPLE = FIXTURES / "apple"


def fixture(name: str) -> str:
    return (APPLE / name).read_text()


def test_hid_idle_time_is_nanoseconds_since_the_last_input() -> None:
    assert parse_hid_idle_seconds(fixture("ioreg-hidsystem.txt")) == pytest.approx(754.018916625)
    assert parse_hid_idle_seconds("+-o Root  <class IORegistryEntry>") is None


def test_power_source_on_ac_on_battery_and_without_a_battery() -> None:
    assert parse_power_source(fixture("pmset-batt-ac.txt")) == PowerSource(True, 100, "charged")
    assert parse_power_source(fixture("pmset-batt-battery.txt")) == PowerSource(False, 63, "discharging")
    assert parse_power_source(fixture("pmset-batt-desktop.txt")) == PowerSource(True, None, "")
    assert parse_power_source("") is None


def test_thermal_pressure_levels_and_cpu_throttling() -> None:
    assert parse_thermal_pressure(fixture("notifyutil-thermalpressure-nominal.txt")) is ThermalPressure.NOMINAL
    assert parse_thermal_pressure(fixture("notifyutil-thermalpressure-heavy.txt")) is ThermalPressure.HEAVY
    assert parse_thermal_pressure("com.apple.system.thermalpressurelevel 9") is ThermalPressure.SLEEPING
    assert parse_thermal_pressure("notifyutil: unknown name") is None
    assert parse_cpu_speed_limit(fixture("pmset-therm-nominal.txt")) is None  # only notes: nothing recorded
    assert parse_cpu_speed_limit(fixture("pmset-therm-throttled.txt")) == 71


def test_assertions_system_wide_and_their_holders() -> None:
    idle = parse_assertions(fixture("pmset-assertions-idle.txt"))
    assert idle.system["UserIsActive"] == 0 and idle.system["PreventUserIdleSystemSleep"] == 1
    assert len(idle.system) == 8  # the kernel assertions section is not system-wide status
    assert [(h.pid, h.process) for h in idle.holders] == [(412, "powerd"), (9321, "python3.11")]
    video = parse_assertions(fixture("pmset-assertions-video.txt"))
    assert video.system["PreventUserIdleDisplaySleep"] == 1
    chrome = [h for h in video.holders if h.kind == "PreventUserIdleDisplaySleep"]
    assert [(h.process, h.name) for h in chrome] == [("Google Chrome Helper", "Video Wake Lock")]


def signals(**changes: object) -> MacSignals:
    idle = {
        "idle_seconds": parse_hid_idle_seconds(fixture("ioreg-hidsystem.txt")),
        "power": parse_power_source(fixture("pmset-batt-ac.txt")),
        "thermal": parse_thermal_pressure(fixture("notifyutil-thermalpressure-nominal.txt")),
        "cpu_speed_limit": parse_cpu_speed_limit(fixture("pmset-therm-nominal.txt")),
        "assertions": parse_assertions(fixture("pmset-assertions-idle.txt")),
    }
    return MacSignals(**{**idle, **changes})  # type: ignore[arg-type]


def test_an_idle_mac_on_ac_is_free_even_while_something_keeps_it_awake() -> None:
    # PreventUserIdleSystemSleep is held (by powerd and by Farm's own worker): not a sign of the owner.
    assert mac_busy_reason(signals()) == ""


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"idle_seconds": 12.0}, "input 12 s ago"),
        ({"power": parse_power_source((APPLE / "pmset-batt-battery.txt").read_text())}, "on battery (63%)"),
        ({"thermal": ThermalPressure.HEAVY}, "thermal pressure heavy"),
        ({"cpu_speed_limit": 71}, "CPU throttled to 71%"),
        ({"assertions": parse_assertions((APPLE / "pmset-assertions-video.txt").read_text())},
         "Google Chrome Helper: Video Wake Lock"),
    ],
)
def test_each_owner_signal_makes_the_mac_busy(changes: dict[str, object], fragment: str) -> None:
    assert fragment in mac_busy_reason(signals(**changes))


def test_rules_can_be_relaxed_and_missing_signals_do_not_judge() -> None:
    on_battery = signals(power=PowerSource(False, 80, "discharging"))
    assert mac_busy_reason(on_battery, MacIdleRules(allow_battery=True)) == ""
    assert mac_busy_reason(signals(idle_seconds=12.0), MacIdleRules(min_idle_seconds=10)) == ""
    assert mac_busy_reason(MacSignals()) == ""


def test_reading_runs_each_tool_and_a_failing_tool_leaves_its_signal_unknown() -> None:
    outputs = {
        HID_IDLE_ARGS: fixture("ioreg-hidsystem.txt"), BATTERY_ARGS: fixture("pmset-batt-battery.txt"),
        THERMAL_PRESSURE_ARGS: fixture("notifyutil-thermalpressure-heavy.txt"),
        ASSERTIONS_ARGS: fixture("pmset-assertions-video.txt"),
    }

    def run(args: Sequence[str]) -> str:  # replays the recordings; pmset -g therm fails as a missing tool would
        if tuple(args) == THERM_ARGS:
            raise FileNotFoundError("pmset")
        return outputs[tuple(args)]

    read = read_mac_signals(run)
    assert read.idle_seconds == pytest.approx(754.018916625)
    assert read.power == PowerSource(False, 63, "discharging")
    assert read.thermal is ThermalPressure.HEAVY
    assert read.cpu_speed_limit is None and len(read.errors) == 1 and "pmset -g therm" in read.errors[0]
    assert "on battery" in mac_busy_reason(read)


@pytest.mark.skipif(sys.platform != "darwin", reason="reads ioreg, pmset and notifyutil: macOS only")
def test_the_live_signals_on_this_mac() -> None:
    read = read_mac_signals()
    assert read.errors == ()
    assert read.idle_seconds is not None and read.idle_seconds >= 0
    assert read.power is not None and read.thermal is not None and read.assertions is not None


def test_every_tool_failing_is_reported_not_raised() -> None:
    def run(args: Sequence[str]) -> str:
        raise subprocess.CalledProcessError(1, list(args))

    read = read_mac_signals(run)
    assert len(read.errors) == 5 and read == MacSignals(errors=read.errors)
