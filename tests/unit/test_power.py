"""Power meters on recorded inputs: NVML through a fake that replays counter steps and power samples on a fake clock,
RAPL on a sysfs tree written from a fixture, the CPU estimate on real CPU time, Apple readers on recorded tool output,
and meter_for's choices. Fixtures: tests/fixtures/power/ (README.md there says what each one is)."""

from __future__ import annotations

import bisect
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from farm.core.energy import EnergyScope, EnergySource
from farm_agent.power import EnergyWindow, UnavailableMeter, idle_power, meter_for
from farm_agent.power import rapl as rapl_module
from farm_agent.power.apple import (
    AppleMeter,
    AppleSample,
    AppleTools,
    SampleStream,
    ZeusCounters,
    integrate,
    parse_macmon_line,
    parse_powermetrics,
)
from farm_agent.power.estimate import CpuEstimateMeter, default_rated_watts
from farm_agent.power.nvml import NvmlCounterMeter, NvmlPowerMeter, open_nvml_meter, trapezoid_joules
from farm_agent.power.rapl import RaplMeter, delta_uj, open_rapl_meter, package_zones

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "power"
ROOT = Path(__file__).resolve().parents[2]


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


# --- NVML: a fake that replays a recording on a fake clock ---


class FakeClock:
    """Seconds that move only when told: by sleep(), by advance(), and by each NVML call's cost."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeNvmlError(Exception):
    """Stands in for pynvml.NVMLError; str() is NVML's message."""


class FakeNvml:
    """Replays tests/fixtures/power/nvml-*.json: the counter is the value of the last step at or before the clock's
    time (a recorded edge [t_old_read, t_new_read, mJ] steps at its midpoint), power is interpolated between samples.
    Each call costs `call_s` of fake time, as a real NVML call costs ~tens of microseconds."""

    NVMLError = FakeNvmlError

    def __init__(self, recording: dict[str, Any], clock: FakeClock, *, call_s: float = 30e-6,
                 fail: dict[str, str] | None = None) -> None:
        self.clock, self.call_s, self.fail = clock, call_s, fail or {}
        counter = recording.get("counter") or recording.get("edges")
        steps = [((e[0] + e[1]) / 2, e[2]) if len(e) == 3 else (e[0], e[1]) for e in counter] if counter else []
        self.step_times: list[float] = [float(t) for t, _ in steps]
        self.step_values: list[int] = [int(v) for _, v in steps]
        power = recording.get("power_mw") or [[p[0], p[1]] for p in recording.get("power", [])]
        self.power_t = [p[0] for p in power]
        self.power_mw = [p[1] for p in power]
        self.inits = 0
        self.calls: list[str] = []
        self.memory: dict[str, int] | None = None  # nvmlDeviceGetMemoryInfo's answer: used, total, free

    def _call(self, name: str) -> None:
        self.calls.append(name)
        self.clock.advance(self.call_s)
        if name in self.fail:
            raise FakeNvmlError(self.fail[name])

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.inits -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        self._call("nvmlDeviceGetHandleByIndex")
        if index != 0:
            raise FakeNvmlError("Invalid Argument")
        return ("handle", index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> tuple[str, str]:
        self._call("nvmlDeviceGetHandleByUUID")
        if uuid != "GPU-d9f13f7d-3950-ce17-6430-74d61c271fe7":
            raise FakeNvmlError("Not Found")
        return ("handle", uuid)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._call("nvmlDeviceGetTotalEnergyConsumption")
        if not self.step_times:
            raise FakeNvmlError("Not Supported")
        i = bisect.bisect_right(self.step_times, self.clock.t) - 1
        return int(self.step_values[max(i, 0)])

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._call("nvmlDeviceGetPowerUsage")
        if not self.power_t:
            raise FakeNvmlError("Not Supported")
        return round(self._power_mw(self.clock.t))

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        self._call("nvmlDeviceGetMemoryInfo")
        if self.memory is None:
            raise FakeNvmlError("Not Supported")
        return SimpleNamespace(**self.memory)

    def _power_mw(self, t: float) -> float:
        i = bisect.bisect_right(self.power_t, t)
        if i == 0:
            return float(self.power_mw[0])
        if i == len(self.power_t):
            return float(self.power_mw[-1])
        (t0, p0), (t1, p1) = (self.power_t[i - 1], self.power_mw[i - 1]), (self.power_t[i], self.power_mw[i])
        return float(p0 + (p1 - p0) * (t - t0) / (t1 - t0))


def counter_meter(recording: dict[str, Any], start: float, **options: Any) -> tuple[NvmlCounterMeter, FakeClock]:
    clock = FakeClock(start)
    nvml = FakeNvml(recording, clock)
    meter = open_nvml_meter("0", nvml=nvml, clock=clock, sleep=clock.sleep)
    assert isinstance(meter, NvmlCounterMeter), meter
    for name, value in options.items():
        setattr(meter, name, value)
    return meter, clock


def measure(meter: NvmlCounterMeter, clock: FakeClock, seconds: float) -> EnergyWindow:
    with meter.window() as w:
        clock.advance(seconds)  # the work
    return w


STEPS = fixture("nvml-h200-steps.json")
LOAD_W = STEPS["steady_watts"]["load"]
PHASES = [2.0 + i * 0.01 for i in range(10)]  # window starts across one 100 ms step, in the steady load


@pytest.mark.parametrize("start", PHASES)
def test_an_aligned_250ms_window_reads_the_steady_power_at_any_phase(start: float) -> None:
    meter, clock = counter_meter(STEPS, start)
    w = measure(meter, clock, 0.25)
    e = w.energy
    assert e is not None
    assert (e.source, e.scope) == (EnergySource.COUNTER, EnergyScope.DEVICE)
    # Whole steps over the time they took: within 2 % (the edge is known to +-1 ms, the poll interval's half).
    assert e.watts == pytest.approx(LOAD_W, rel=0.02)
    # The figure covers the block and at most one step after it, never less than the block.
    assert 0.25 <= e.seconds <= 0.25 + 0.1 + 0.005
    assert w.wall_seconds == pytest.approx(0.25, abs=1e-3)
    assert w.note == ""


def test_the_aligned_window_is_the_counter_difference_between_two_step_edges() -> None:
    meter, clock = counter_meter(STEPS, 2.004)
    e = measure(meter, clock, 0.25).energy
    assert e is not None
    # Steps land at 0.037 + 0.1 k; at 680 W each adds 68 J. Entered at 2.004: the edge at 2.037. The block ends at
    # ~2.287; the next edge is 2.337: three steps, 204 J over 0.3 s.
    assert e.joules == pytest.approx(3 * 68.0, abs=1e-9)
    assert e.seconds == pytest.approx(0.3, abs=0.002)


def test_without_alignment_a_250ms_window_is_off_by_a_partial_step() -> None:
    # The bias the alignment removes: read at arbitrary phases, 250 ms holds 2 or 3 steps: 0.8x or 1.2x.
    errors = []
    for start in PHASES:
        meter, clock = counter_meter(STEPS, start, align=False)
        e = measure(meter, clock, 0.25).energy
        assert e is not None
        errors.append(e.watts / LOAD_W - 1)
    assert max(abs(x) for x in errors) > 0.15
    assert min(errors) < -0.15 and max(errors) > 0.15


def test_longer_windows_and_the_idle_to_load_edge() -> None:
    meter, clock = counter_meter(STEPS, 0.2)
    idle = measure(meter, clock, 0.5).energy
    assert idle is not None and idle.watts == pytest.approx(STEPS["steady_watts"]["idle"], rel=0.01)
    meter, clock = counter_meter(STEPS, 2.5)
    long = measure(meter, clock, 3.0).energy
    assert long is not None and long.watts == pytest.approx(LOAD_W, rel=0.005)
    # Straddling the start of the load at 1.0 s: the average of the two, weighted by time (exactly, step by step).
    meter, clock = counter_meter(STEPS, 0.5)
    mixed = measure(meter, clock, 1.0).energy
    assert mixed is not None
    expected = (125.0 * (1.0 - 0.537) + 680.0 * (1.637 - 1.0)) / (1.637 - 0.537)
    assert mixed.watts == pytest.approx(expected, rel=0.005)


def test_a_counter_that_does_not_step_is_read_unaligned_and_says_so() -> None:
    flat = {"counter": [[0.0, 1000], [10.0, 2000]], "power_mw": [[0.0, 60000]]}
    meter, clock = counter_meter(flat, 1.0)
    w = measure(meter, clock, 0.25)
    assert w.energy is not None and w.energy.joules == 0.0
    assert "not aligned" in w.note
    # Each end waited the timeout, no longer; the span runs from the start's last read to the end's last read.
    assert w.energy.seconds == pytest.approx(0.25 + 0.12, abs=0.005)
    assert w.wall_seconds == pytest.approx(0.25, abs=0.001)


def test_slow_reads_are_read_back_to_back_and_a_loose_edge_is_named() -> None:
    # At the H200's 99th-percentile read (15 ms) the edge is known to +-7.5 ms: still within 5 % over 300 ms, and
    # the note says so.
    clock = FakeClock(2.0)
    meter = open_nvml_meter("0", nvml=FakeNvml(STEPS, clock, call_s=0.015), clock=clock, sleep=clock.sleep)
    assert isinstance(meter, NvmlCounterMeter)
    w = measure(meter, clock, 0.25)
    assert w.energy is not None and w.energy.watts == pytest.approx(LOAD_W, rel=0.05)
    assert "known only to +-8 ms" in w.note
    meter, clock = counter_meter(STEPS, 2.0)
    assert measure(meter, clock, 0.25).note == ""  # 30 us reads: no note


def test_a_counter_that_goes_backwards_is_not_measured() -> None:
    reset = {"counter": [[0.0, 9_000_000], [1.05, 9_068_000], [1.15, 50], [1.25, 68_050]], "power_mw": [[0, 1]]}
    meter, clock = counter_meter(reset, 1.0)
    w = measure(meter, clock, 0.1)
    assert w.energy is None and "backwards" in w.note


def test_reading_energy_inside_the_window_is_an_error() -> None:
    meter, clock = counter_meter(STEPS, 2.0)
    with meter.window() as w:
        with pytest.raises(RuntimeError, match="still open"):
            _ = w.energy
    assert w.energy is not None


def test_power_is_nvmls_averaged_reading_labelled_vendor_estimate() -> None:
    meter, clock = counter_meter(STEPS, 2.5)  # 1 s after the load began, the 1 s average is half-way up
    p = meter.power()
    assert p is not None
    assert (p.source, p.scope) == (EnergySource.VENDOR_ESTIMATE, EnergyScope.DEVICE)
    assert p.watts == pytest.approx((125 + 680) / 2, rel=0.01)


def test_the_meter_holds_one_nvml_session_until_closed() -> None:
    clock = FakeClock(2.0)
    nvml = FakeNvml(STEPS, clock)
    meter = open_nvml_meter("0", nvml=nvml, clock=clock, sleep=clock.sleep)
    assert nvml.inits == 1
    meter.close()
    meter.close()
    assert nvml.inits == 0


# --- NVML without the counter: power samples integrated in a background thread ---


class SamplerTime(FakeClock):
    """A fake clock that the sampling thread moves, in its waits, up to a horizon the test sets; run_to(t) returns
    once the thread has taken every sample up to t."""

    def __init__(self, t: float) -> None:
        super().__init__(t)
        self.horizon = t
        self.parked = False
        self.cond = threading.Condition()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        with self.cond:
            while True:
                if stop.is_set():
                    return True
                if self.t + seconds <= self.horizon + 1e-9:
                    self.t += seconds
                    return False
                self.parked = True
                self.cond.notify_all()
                self.cond.wait(0.005)  # wake to see `stop`, which is an Event, not this condition

    def run_to(self, t: float) -> None:
        with self.cond:
            self.horizon, self.parked = t, False
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: self.parked, timeout=10)
            self.t = t


NO_COUNTER = fixture("nvml-no-counter.json")


def exact_joules(recording: dict[str, Any], t0: float, t1: float) -> float:
    """The recorded power curve (linear between samples) integrated exactly between t0 and t1."""
    fake = FakeNvml(recording, FakeClock())
    points = [t0, *[t for t in fake.power_t if t0 < t < t1], t1]
    return trapezoid_joules([(t, fake._power_mw(t) / 1000) for t in points])


def test_without_the_counter_power_samples_are_integrated_and_labelled() -> None:
    clock = SamplerTime(0.9)
    nvml = FakeNvml(NO_COUNTER, clock, call_s=0.0)
    meter = open_nvml_meter("0", nvml=nvml, clock=clock, wait=clock.wait)
    assert isinstance(meter, NvmlPowerMeter)
    assert "not supported" in meter.reason.lower() and "nvmlDeviceGetPowerUsage" in meter.reason
    with meter.window() as w:
        clock.run_to(2.13)  # the work: idle, the ramp, then load with a ripple
    e = w.energy
    assert e is not None
    assert (e.source, e.scope) == (EnergySource.VENDOR_ESTIMATE, EnergyScope.DEVICE)
    assert e.seconds == pytest.approx(2.13 - 0.9)
    # 50 ms samples of a curve recorded every 20 ms: within 1 % of the exact integral.
    assert e.joules == pytest.approx(exact_joules(NO_COUNTER, 0.9, 2.13), rel=0.01)
    # A sample at each end and one every 50 ms between.
    assert "26 NVML power samples" in w.note


def test_trapezoid() -> None:
    assert trapezoid_joules([(0.0, 100.0), (1.0, 200.0), (3.0, 200.0)]) == pytest.approx(150.0 + 400.0)
    assert trapezoid_joules([(0.0, 5.0)]) == 0.0


# --- NVML through meter_for ---


def test_meter_for_cuda_picks_the_counter_then_power_then_says_why_not() -> None:
    clock = FakeClock(2.0)
    assert isinstance(meter_for("cuda:0", nvml=FakeNvml(STEPS, clock)), NvmlCounterMeter)
    assert isinstance(meter_for("cuda", nvml=FakeNvml(STEPS, clock)), NvmlCounterMeter)  # cuda means cuda:0
    by_uuid = meter_for("cuda:GPU-d9f13f7d-3950-ce17-6430-74d61c271fe7", nvml=FakeNvml(STEPS, clock))
    assert isinstance(by_uuid, NvmlCounterMeter) and by_uuid.device.endswith("fe7")
    assert isinstance(meter_for("cuda:0", nvml=FakeNvml(NO_COUNTER, clock)), NvmlPowerMeter)

    no_driver = FakeNvml(STEPS, clock, fail={"nvmlInit": "Driver Not Loaded"})
    m = meter_for("cuda:0", nvml=no_driver)
    assert isinstance(m, UnavailableMeter) and not m.available and "Driver Not Loaded" in m.reason
    with m.window() as w:
        pass
    assert w.energy is None and m.power() is None

    fake = FakeNvml(STEPS, clock)
    m = meter_for("cuda:3", nvml=fake)
    assert isinstance(m, UnavailableMeter) and "no device '3'" in m.reason
    assert fake.inits == 0  # the session opened for the lookup was closed

    neither = FakeNvml({"counter": None, "power_mw": None}, clock)
    m = meter_for("cuda:0", nvml=neither)
    assert isinstance(m, UnavailableMeter) and "neither" in m.reason


def test_meter_for_cuda_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    m = meter_for("cuda:0")
    assert isinstance(m, UnavailableMeter) and "nvidia-ml-py not installed" in m.reason


def test_meter_for_an_unknown_device_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="no power meter"):
        meter_for("tpu:0")


# --- RAPL on a sysfs tree written from a fixture ---


def rapl_tree(tmp_path: Path, name: str = "rapl-two-packages.json") -> Path:
    for zone, files in fixture(name)["zones"].items():
        folder = tmp_path / "sys" / "class" / "powercap" / zone
        folder.mkdir(parents=True)
        for file, content in files.items():
            (folder / file).write_text(content + "\n")
    return tmp_path


def add_uj(root: Path, zone: str, microjoules: int) -> None:
    path = root / "sys" / "class" / "powercap" / zone / "energy_uj"
    max_range = int((path.parent / "max_energy_range_uj").read_text())
    path.write_text(f"{(int(path.read_text()) + microjoules) % max_range}\n")


def test_rapl_sums_the_packages_only(tmp_path: Path) -> None:
    root = rapl_tree(tmp_path)
    zones, why = package_zones(root)
    assert why == "" and [z.name for z in zones] == ["package-0", "package-1"]
    clock = FakeClock(100.0)
    meter, why = open_rapl_meter(root, clock=clock)
    assert isinstance(meter, RaplMeter) and why == ""
    with meter.window() as w:
        clock.advance(2.0)
        add_uj(root, "intel-rapl:0", 30_000_000)
        add_uj(root, "intel-rapl:1", 20_000_000)  # package-1 wraps in the fixture: see the next test
        for other in ("intel-rapl:0:0", "intel-rapl:1:0", "intel-rapl:2", "intel-rapl-mmio:0"):
            add_uj(root, other, 999_000_000)  # dram, psys and the mmio twin must not count
    e = w.energy
    assert e is not None
    assert (e.source, e.scope) == (EnergySource.COUNTER, EnergyScope.PACKAGE)
    assert e.joules == pytest.approx(50.0) and e.seconds == pytest.approx(2.0)
    assert e.watts == pytest.approx(25.0)


def test_rapl_wraps_at_max_energy_range(tmp_path: Path) -> None:
    root = rapl_tree(tmp_path)
    before = int((root / "sys/class/powercap/intel-rapl:1/energy_uj").read_text())
    add_uj(root, "intel-rapl:1", 20_000_000)
    after = int((root / "sys/class/powercap/intel-rapl:1/energy_uj").read_text())
    assert after < before  # the fixture's package-1 sits 328 850 uJ below its range: this add wrapped it
    assert delta_uj(before, after, 262143328850) == 20_000_000
    assert delta_uj(10, 25, 100) == 15


def test_rapl_power_is_the_average_since_the_last_reading(tmp_path: Path) -> None:
    root = rapl_tree(tmp_path)
    clock = FakeClock(0.0)
    meter, _ = open_rapl_meter(root, clock=clock)
    assert meter is not None
    clock.advance(0.5)
    add_uj(root, "intel-rapl:0", 40_000_000)
    p = meter.power()
    assert p is not None and p.watts == pytest.approx(80.0) and p.source == EnergySource.COUNTER
    assert meter.power() is None  # no time has passed since


def denied(path: Path) -> str:
    if path.name == "energy_uj":
        raise PermissionError(13, "Permission denied", str(path))
    return path.read_text()


def test_rapl_permission_denied_falls_back_to_the_estimate_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = rapl_tree(tmp_path)
    meter, why = open_rapl_meter(root, read=denied)
    assert meter is None and "permission denied" in why and "intel-rapl:0/energy_uj" in why
    # Through the chooser: these tests run as root, where chmod cannot deny a read, so the read is patched.
    monkeypatch.setattr(rapl_module, "read_text", denied)
    cpu = meter_for("cpu", root=root, system="linux", cpu_rated_watts=65)
    assert isinstance(cpu, CpuEstimateMeter)
    assert "permission denied" in cpu.reason and "model estimate" in cpu.reason
    assert cpu.source == EnergySource.MODEL_ESTIMATE and cpu.rated_watts == 65


def test_meter_for_cpu_takes_rapl_when_readable_and_the_estimate_without_it(tmp_path: Path) -> None:
    assert isinstance(meter_for("cpu", root=rapl_tree(tmp_path / "a"), system="linux"), RaplMeter)
    bare = meter_for("cpu", root=tmp_path / "b", system="linux")
    assert isinstance(bare, CpuEstimateMeter) and "does not exist" in bare.reason
    (tmp_path / "c" / "sys" / "class" / "powercap" / "intel-rapl:0").mkdir(parents=True)
    (tmp_path / "c" / "sys" / "class" / "powercap" / "intel-rapl:0" / "name").write_text("psys\n")
    psys_only = meter_for("cpu", root=tmp_path / "c", system="linux")
    assert isinstance(psys_only, CpuEstimateMeter) and "no package zones" in psys_only.reason


# --- the CPU estimate ---


def test_the_estimate_bills_this_process_cpu_time_at_rated_watts_per_core() -> None:
    meter = CpuEstimateMeter(40.0, cores=4)  # 10 W for each busy core
    assert (meter.source, meter.scope) == (EnergySource.MODEL_ESTIMATE, EnergyScope.PACKAGE)
    proc = psutil.Process()
    with meter.window() as w:
        began = time.process_time()
        while time.process_time() - began < 0.3:  # one busy core for 0.3 s
            sum(range(1000))
        burned = time.process_time() - began
    e = w.energy
    assert e is not None
    assert (e.source, e.scope) == (EnergySource.MODEL_ESTIMATE, EnergyScope.PACKAGE)
    # cpu_times ticks every 10 ms: allow two ticks.
    assert e.joules == pytest.approx(burned * 10.0, abs=0.2)
    # Not the whole package for the wall time (40 W x 0.3 s = 12 J): one core of four.
    assert e.joules < 0.5 * 40.0 * e.seconds
    assert "idle not billed" in w.note
    assert proc.cpu_times().user > 0


def test_the_estimate_bills_nothing_for_idle() -> None:
    meter = CpuEstimateMeter(40.0, cores=4)
    with meter.window() as w:
        time.sleep(0.05)
    # A sleeping process is billed nothing; two 10 ms scheduler ticks (0.02 core-s x 10 W) of slack for the window's
    # own bookkeeping on a loaded machine. Billing the 50 ms of wall time would be 0.5 J.
    assert w.energy is not None and w.energy.joules < 0.25 and w.energy.seconds >= 0.05


def test_the_estimate_counts_waited_for_children() -> None:
    meter = CpuEstimateMeter(20.0, cores=2)
    with meter.window() as w:
        burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
        subprocess.run([sys.executable, "-c", burn], check=True)
    assert w.energy is not None and w.energy.joules >= 0.25 * 10.0


def test_rated_watts_come_from_the_argument_the_environment_or_the_core_count() -> None:
    assert default_rated_watts(8, {}) == 80.0
    assert default_rated_watts(64, {}) == 150.0
    assert default_rated_watts(8, {"FARM_CPU_RATED_W": "65"}) == 65.0
    assert default_rated_watts(8, {"FARM_CPU_RATED_W": "lots"}) == 80.0
    assert default_rated_watts(8, {"FARM_CPU_RATED_W": "-3"}) == 80.0
    assert CpuEstimateMeter(cores=4, environ={"FARM_CPU_RATED_W": "28"}).rated_watts == 28.0
    assert CpuEstimateMeter(95.0, cores=4, environ={"FARM_CPU_RATED_W": "28"}).rated_watts == 95.0


def test_the_estimate_power_is_rated_times_utilisation() -> None:
    readings = iter([0.0, 50.0, 250.0])
    meter = CpuEstimateMeter(60.0, cores=4, cpu_percent=lambda: next(readings))
    p = meter.power()
    assert p is not None and p.watts == 30.0 and p.source == EnergySource.MODEL_ESTIMATE
    assert meter.power() == p.model_copy(update={"watts": 60.0})  # clamped to 100 %


# --- Apple: parsers of recorded tool output ---


MACMON = (FIXTURES / "macmon-pipe.jsonl").read_text().splitlines()
T0 = 1762584861.0  # 2025-11-08T06:54:21+00:00, the second the macmon recording starts in


def test_macmon_lines_parse_to_watts_by_component() -> None:
    stamp, watts = parse_macmon_line(MACMON[3 + 1]) or (None, {})  # the line after the stderr warning
    assert stamp == pytest.approx(T0 + 0.4)
    assert watts == {"cpu": 2.4, "gpu": 0.06, "ane": 2.5, "soc": 4.96}
    assert parse_macmon_line(MACMON[3]) is None  # a warning, not JSON
    assert parse_macmon_line("") is None
    assert parse_macmon_line("[1, 2]") is None
    nested = (FIXTURES / "macmon-pipe-nested.jsonl").read_text().splitlines()
    stamp, watts = parse_macmon_line(nested[0]) or (None, {})
    assert watts == {"cpu": 2.4, "gpu": 0.06, "ane": 2.5, "soc": 5.42}
    assert stamp is not None
    bad_stamp = parse_macmon_line(nested[1])
    assert bad_stamp is not None and bad_stamp[0] is None


def test_powermetrics_text_parses_to_samples() -> None:
    samples = parse_powermetrics((FIXTURES / "powermetrics.txt").read_text())
    assert [s for s, _ in samples] == pytest.approx([0.10183, 0.10052, 0.10211, 0.10095])
    assert [w["ane"] for _, w in samples] == [0.0, 1.84, 2.52, 0.0]
    assert samples[1][1] == pytest.approx({"cpu": 2.21, "gpu": 0.031, "ane": 1.84, "soc": 4.081})  # the first GPU line
    assert parse_powermetrics("Machine model: Mac16,6\n") == []


def test_integrate_bills_each_sample_for_its_overlap() -> None:
    samples = [AppleSample(end=1.0, seconds=1.0, watts={"ane": 2.0}), AppleSample(end=2.0, seconds=1.0,
                                                                                  watts={"ane": 4.0})]
    assert integrate(samples, 0.5, 1.5, "ane") == pytest.approx((0.5 * 2 + 0.5 * 4, 1.0))
    assert integrate(samples, 1.2, 1.4, "ane") == pytest.approx((0.8, 0.2))
    assert integrate(samples, 2.5, 3.0, "ane") == (0.0, 0.0)
    assert integrate(samples, 0.0, 2.0, "gpu") == (0.0, 0.0)


# --- Apple: the meters, with their tools replaced ---


class ReleasedLines:
    """A fake tool process whose stdout replays recorded lines once the test releases them, as a tool's samples
    arrive while a window is open."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines, self.go, self.terminated = list(lines), threading.Event(), False

    @property
    def stdout(self) -> Iterator[str]:
        assert self.go.wait(10)
        yield from self.lines

    def terminate(self) -> None:
        self.terminated = True

    def wait(self, timeout: float | None = None) -> int:
        return 0


def tools_with(proc: ReleasedLines | None = None, *, zeus: Any = None, on_path: Sequence[str] = (),
               root: bool = False, clock: FakeClock | None = None) -> tuple[AppleTools, list[Sequence[str]]]:
    spawned: list[Sequence[str]] = []

    def spawn(args: Sequence[str]) -> ReleasedLines:
        spawned.append(args)
        assert proc is not None
        return proc

    tools = AppleTools(
        load_zeus=lambda: (zeus, "") if zeus is not None else (None, "zeus-apple-silicon not installed (test)"),
        which=lambda name: f"/opt/homebrew/bin/{name}" if name in on_path else None,
        spawn=spawn, is_root=lambda: root, clock=clock or FakeClock(T0),
    )
    return tools, spawned


def test_the_macmon_meter_integrates_its_samples_over_the_window() -> None:
    clock = FakeClock(T0 + 0.25)
    proc = ReleasedLines(MACMON)
    tools, spawned = tools_with(proc, on_path=["macmon", "powermetrics"], clock=clock)
    meter = meter_for("ane", system="darwin", apple=tools)
    assert isinstance(meter, AppleMeter) and meter.reader.tool == "macmon"
    assert spawned == [("macmon", "pipe", "-i", "100")]
    assert "zeus-apple-silicon not installed" in meter.reason and "sampling macmon" in meter.reason
    assert (meter.source, meter.scope) == (EnergySource.VENDOR_ESTIMATE, EnergyScope.DEVICE)
    with meter.window() as w:
        proc.go.set()
        stream = meter.reader
        assert isinstance(stream, SampleStream)
        with stream._cond:
            assert stream._cond.wait_for(lambda: stream.ended, timeout=10)
        clock.t = T0 + 0.75
    e = w.energy
    assert e is not None
    # ANE samples, each the average of the 100 ms before its stamp: 1.2 W over (.2, .3], 2.5 W over (.3, .7],
    # 0.4 W over (.7, .8]. [.25, .75]: 0.05 s x 1.2 W + 0.4 s x 2.5 W + 0.05 s x 0.4 W = 1.08 J.
    assert e.joules == pytest.approx(0.05 * 1.2 + 0.4 * 2.5 + 0.05 * 0.4)
    assert e.seconds == pytest.approx(0.5)
    assert (e.source, e.scope) == (EnergySource.VENDOR_ESTIMATE, EnergyScope.DEVICE)
    p = meter.power()
    assert p is not None and p.watts == 0.0  # the latest sample, at .9: ANE idle again
    meter.close()
    assert proc.terminated


def test_the_soc_meter_reads_all_power_and_bills_gaps_at_the_average() -> None:
    clock = FakeClock(T0 + 0.85)
    proc = ReleasedLines(MACMON)
    tools, _ = tools_with(proc, on_path=["macmon"], clock=clock)
    meter = meter_for("soc", system="darwin", apple=tools)
    assert isinstance(meter, AppleMeter) and meter.scope == EnergyScope.PACKAGE
    with meter.window() as w:
        proc.go.set()
        stream = meter.reader
        assert isinstance(stream, SampleStream)
        with stream._cond:
            assert stream._cond.wait_for(lambda: stream.ended, timeout=10)
        clock.t = T0 + 1.05  # past the recording's end at .9: 0.05 s covered, 0.15 s not
    e = w.energy
    assert e is not None
    assert e.joules == pytest.approx(0.95 * 0.2)  # the covered part's 0.95 W over the whole 0.2 s
    assert "covering 25%" in w.note


def test_the_powermetrics_meter_anchors_its_timeline_at_the_first_sample() -> None:
    clock = FakeClock(500.0)
    lines = (FIXTURES / "powermetrics.txt").read_text().splitlines(keepends=True)
    proc = ReleasedLines(lines)
    tools, spawned = tools_with(proc, on_path=["powermetrics", "macmon-not-this"], root=True, clock=clock)
    meter = meter_for("mps", system="darwin", apple=tools)
    assert isinstance(meter, AppleMeter) and meter.reader.tool == "powermetrics"
    assert spawned[0][:3] == ("powermetrics", "--samplers", "cpu_power,gpu_power,ane_power")
    assert meter.component == "gpu" and meter.scope == EnergyScope.DEVICE
    with meter.window() as w:
        proc.go.set()  # the first header arrives now (500.0): sample 1 ends there, the others follow it
        stream = meter.reader
        assert isinstance(stream, SampleStream)
        with stream._cond:
            assert stream._cond.wait_for(lambda: stream.ended, timeout=10)
        clock.t = 500.2
    e = w.energy
    assert e is not None
    # Samples end at 500.0, 500.10052, 500.20263: GPU 31 mW over 0.10052 s, 30 mW over 0.2 - 0.10052 s.
    assert e.joules == pytest.approx(0.031 * 0.10052 + 0.030 * (0.2 - 0.10052))


def test_zeus_apple_silicon_counters_are_preferred() -> None:
    readings = iter([
        SimpleNamespace(cpu_total_mj=1000, gpu_mj=50, ane_mj=10, dram_mj=5),   # probe
        SimpleNamespace(cpu_total_mj=2000, gpu_mj=60, ane_mj=100, dram_mj=9),  # window start
        SimpleNamespace(cpu_total_mj=2600, gpu_mj=75, ane_mj=1350, dram_mj=20),  # window end
    ])
    module = SimpleNamespace(AppleEnergyMonitor=lambda: SimpleNamespace(get_cumulative_energy=lambda: next(readings)))
    clock = FakeClock(T0)
    tools, spawned = tools_with(zeus=module, on_path=["macmon"], clock=clock)
    meter = meter_for("ane", system="darwin", apple=tools)
    assert isinstance(meter, AppleMeter) and isinstance(meter.reader, ZeusCounters) and meter.reason == ""
    assert spawned == []  # no sampling subprocess
    with meter.window() as w:
        clock.advance(0.5)
    e = w.energy
    assert e is not None and e.joules == pytest.approx(1.25) and e.seconds == pytest.approx(0.5)
    assert (e.source, e.scope) == (EnergySource.VENDOR_ESTIMATE, EnergyScope.DEVICE)


def test_a_chip_without_the_ane_counter_falls_through_with_reasons() -> None:
    module = SimpleNamespace(AppleEnergyMonitor=lambda: SimpleNamespace(
        get_cumulative_energy=lambda: SimpleNamespace(cpu_total_mj=1, gpu_mj=1, ane_mj=None)))
    tools, _ = tools_with(zeus=module)
    m = meter_for("ane", system="darwin", apple=tools)
    assert isinstance(m, UnavailableMeter)
    assert "reports no ane energy" in m.reason and "macmon not on PATH" in m.reason and "needs root" in m.reason


def test_apple_devices_on_linux_are_unavailable_and_say_why() -> None:
    for device in ("ane", "mps", "soc"):
        m = meter_for(device, system="linux")
        assert isinstance(m, UnavailableMeter) and not m.available
        assert "macOS" in m.reason and "linux" in m.reason
        with m.window() as w:
            pass
        assert w.energy is None and "not measured" in w.note and m.power() is None
    assert meter_for("ane", system="linux").scope == EnergyScope.DEVICE
    assert meter_for("soc", system="linux").scope == EnergyScope.PACKAGE


def test_meter_for_cpu_on_a_mac_reads_apple_cpu_energy_else_estimates() -> None:
    counters = SimpleNamespace(cpu_total_mj=1000, gpu_mj=1, ane_mj=1)
    module = SimpleNamespace(AppleEnergyMonitor=lambda: SimpleNamespace(get_cumulative_energy=lambda: counters))
    tools, _ = tools_with(zeus=module)
    mac = meter_for("cpu", system="darwin", apple=tools)
    assert isinstance(mac, AppleMeter) and mac.component == "cpu" and mac.scope == EnergyScope.PACKAGE
    tools, _ = tools_with()
    fallback = meter_for("cpu", system="darwin", apple=tools)
    assert isinstance(fallback, CpuEstimateMeter)
    assert "macmon not on PATH" in fallback.reason and "model estimate" in fallback.reason


# --- the daemon stays light ---


def test_importing_and_choosing_meters_loads_neither_torch_nor_pynvml_needlessly() -> None:
    code = (
        "import sys\n"
        "from farm_agent.power import meter_for\n"
        "assert 'pynvml' not in sys.modules, 'pynvml imported at module import'\n"
        "meter_for('cpu'); meter_for('ane')\n"
        "assert 'pynvml' not in sys.modules, 'pynvml imported for a CPU meter'\n"
        "meter_for('cuda:0')\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    path = [str(ROOT / "agents"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# --- the real recording from the lent H200 (tests/fixtures/power/h200-measured.md) ---


H200 = fixture("nvml-h200-recorded.json")


def h200_mean_watts(a: float, b: float) -> float:
    """The recording's own average between the first step after `a` and the last before `b`."""
    fake = FakeNvml(H200, FakeClock())
    i0, i1 = bisect.bisect_left(fake.step_times, a), bisect.bisect_right(fake.step_times, b) - 1
    return (fake.step_values[i1] - fake.step_values[i0]) / 1000 / (fake.step_times[i1] - fake.step_times[i0])


def h200_window(start: float, seconds: float, *, align: bool = True) -> float:
    clock = FakeClock(start)
    meter = open_nvml_meter("0", nvml=FakeNvml(H200, clock, call_s=0.003), clock=clock, sleep=clock.sleep)
    assert isinstance(meter, NvmlCounterMeter)
    meter.align = align  # a counter read cost ~3 ms there: call_s above
    e = measure(meter, clock, seconds).energy
    assert e is not None
    return e.watts


def test_on_the_h200_recording_idle_250ms_windows_are_exact_at_every_phase() -> None:
    # Idle with a CUDA context (~123 W) is steady power: there, aligned windows are within 2 % at 61 phases,
    # unaligned ones up to ~20 % off.
    for lo, hi in ((0.05, 0.6), (4.6, 5.5)):
        idle = h200_mean_watts(lo, hi + 0.4)
        starts = [lo + k * (hi - lo) / 60 for k in range(61)]
        aligned = [h200_window(s, 0.25) / idle - 1 for s in starts]
        unaligned = [h200_window(s, 0.25, align=False) / idle - 1 for s in starts]
        assert max(abs(x) for x in aligned) < 0.02
        assert max(abs(x) for x in unaligned) > 0.15


def test_on_the_h200_recording_load_windows_track_the_plateau() -> None:
    # Under the matmul loop the GPU's power itself moves from step to step (the recorded steps hold 55-75 J, a 7 %
    # standard deviation), so a 3-step window cannot be exact; its error is a quarter of the unaligned one's, and
    # 1 s windows are within 3 % of the plateau.
    plateau = h200_mean_watts(1.4, 3.9)
    assert 650 < plateau < 730
    starts = [1.4 + k * 2.1 / 60 for k in range(61)]
    aligned = [h200_window(s, 0.25) / plateau - 1 for s in starts]
    unaligned = [h200_window(s, 0.25, align=False) / plateau - 1 for s in starts]

    def rms(xs: list[float]) -> float:
        return math.sqrt(sum(x * x for x in xs) / len(xs))

    assert rms(aligned) < 0.07 and rms(aligned) < rms(unaligned) / 3
    assert all(abs(h200_window(1.4 + k * 0.1, 1.0) / plateau - 1) < 0.03 for k in range(14))


def test_on_the_h200_nvmls_power_reading_lags_a_load_that_starts_in_the_window() -> None:
    # Why integrated power samples are labelled vendor-estimate: on Hopper nvmlDeviceGetPowerUsage is a 1 s average
    # that lags, so over the 3 s load that starts at 1.0 s it reads well under the counter.
    clock = SamplerTime(1.0)
    samples_only = {"counter": None, "power": H200["power"]}
    meter = open_nvml_meter("0", nvml=FakeNvml(samples_only, clock, call_s=0.0), clock=clock, wait=clock.wait)
    assert isinstance(meter, NvmlPowerMeter)
    with meter.window() as w:
        clock.run_to(4.0)
    assert w.energy is not None
    assert w.energy.watts < 0.92 * h200_mean_watts(1.0, 4.0)


def test_the_estimate_bills_a_few_milliseconds_of_work_at_full_resolution() -> None:
    meter = CpuEstimateMeter(40.0, cores=4)  # 10 W per busy core
    with meter.window() as w:
        began = time.process_time()
        while time.process_time() - began < 0.003:  # 3 ms of CPU: /proc's 10 ms ticks would bill 0 or 0.1 J
            pass
    assert w.energy is not None and 0.025 <= w.energy.joules <= 0.08


# --- the meter's step and the device's idle draw (what the agent reports for auto-sized shards and marginal energy)


def test_the_nvml_counter_step_is_measured_between_two_edges() -> None:
    meter, clock = counter_meter(STEPS, 2.004)
    assert meter.step_s == pytest.approx(0.1, abs=0.003)
    assert clock.t < 2.004 + 0.25  # two edges at most: 2.037 and 2.137
    clock.advance(1.0)
    assert meter.step_s == pytest.approx(0.1, abs=0.003)  # measured once
    flat = {"counter": [[0.0, 1000], [10.0, 2000]], "power_mw": [[0.0, 60000]]}
    stuck, _ = counter_meter(flat, 1.0)
    assert stuck.step_s == stuck.align_timeout_s  # no finer than the wait can tell


def test_idle_power_reads_twenty_steps_on_the_meter_itself() -> None:
    idle = {"counter": [[0.037 + 0.1 * k, 10**9 + 12_500 * k] for k in range(200)]}  # 125 W, 100 ms steps
    meter, clock = counter_meter(idle, 3.01)
    power = idle_power(meter, sleep=clock.sleep)
    assert power is not None and power.watts == pytest.approx(125.0, rel=0.005)
    assert (power.source, power.scope) == (EnergySource.COUNTER, EnergyScope.DEVICE)
    assert 3.01 + 2.0 <= clock.t <= 3.01 + 2.0 + 0.5  # 20 steps of 100 ms, and the edges around them


def test_the_estimates_idle_draw_is_zero_by_construction_and_other_meters_say_their_step() -> None:
    slept: list[float] = []
    estimate = CpuEstimateMeter(80.0, cores=8)
    power = idle_power(estimate, sleep=slept.append)
    assert power is not None and power.watts == 0.0 and power.source is EnergySource.MODEL_ESTIMATE
    assert slept == [] and estimate.step_s == 0.0
    assert idle_power(UnavailableMeter("cuda:0", "no NVML", EnergySource.COUNTER, EnergyScope.DEVICE)) is None


def test_the_agent_reports_each_offers_meter_step_and_idle_draw() -> None:
    import asyncio

    from farm.core.models import BackendName, BackendOffer
    from farm_agent.daemon.main import with_meter_facts

    offers = [BackendOffer(name=BackendName.CPU, device="cpu", threads=2),
              BackendOffer(name=BackendName.CUDA, device="cuda:0", available=False, reason="no GPU")]
    cpu, gpu = asyncio.run(with_meter_facts(offers, {"cpu": CpuEstimateMeter(20.0, cores=2)}))
    assert (cpu.meter_step_s, cpu.idle_w, cpu.idle_source) == (0.0, 0.0, "model-estimate")
    assert gpu == offers[1]  # no meter: nothing claimed


def test_a_gpu_meter_reads_its_memory_for_the_heartbeat() -> None:
    """NVML's nvmlDeviceGetMemoryInfo, as the lent H200 answered it, goes into the heartbeat's gpu_memory; a device
    whose meter reads no memory (the CPU's, a GPU where NVML cannot say) sends none."""
    from farm_agent.daemon.main import gpu_memory

    answered = json.loads((FIXTURES.parent / "hardware" / "nvml-h200.json").read_text())
    meter, _ = counter_meter(fixture("nvml-h200-steps.json"), 0.0)
    meter._dev.nvml.memory = answered["devices"][0]["nvmlDeviceGetMemoryInfo"]  # type: ignore[attr-defined]
    assert meter.memory() == (644939776, 150754820096)
    silent, _ = counter_meter(fixture("nvml-h200-steps.json"), 0.0)  # its NVML says Not Supported
    sent = gpu_memory({"cuda:0": meter, "cuda:1": silent, "cpu": CpuEstimateMeter(40.0, cores=4)})
    assert [(m.device, m.used_bytes, m.total_bytes) for m in sent] == [("cuda:0", 644939776, 150754820096)]


def test_a_window_opened_soon_after_the_last_starts_at_its_end_edge_without_waiting() -> None:
    """A worker's next shard: its window starts at the last one's end edge (no wait for a step), so the two tile the
    counter: together they hold every step between the first's start and the second's end, the gap billed to the
    second."""
    meter, clock = counter_meter(STEPS, 2.004)
    first = measure(meter, clock, 0.25)
    clock.advance(0.03)  # between two shards
    opened = clock()
    with meter.window() as second:
        assert clock() - opened < 0.001  # entered at once: no step waited for
        clock.advance(0.25)
    a, b = first.energy, second.energy
    assert a is not None and b is not None
    assert b.joules == pytest.approx(3 * 68.0, abs=1e-9)  # 2.337 → 2.637: the 30 ms gap and the block, whole steps
    together, covered = a.joules + b.joules, a.seconds + b.seconds
    assert together == pytest.approx(6 * 68.0, abs=1e-9) and covered == pytest.approx(0.6, abs=0.004)


def test_a_window_long_after_the_last_waits_for_its_own_edge() -> None:
    meter, clock = counter_meter(STEPS, 2.004)
    measure(meter, clock, 0.25)
    clock.advance(2.0)  # another job, much later: not billed the idle time between
    e = measure(meter, clock, 0.25).energy
    assert e is not None and e.seconds <= 0.25 + 0.1 + 0.005


def test_a_deferred_window_closes_at_once_and_reads_the_same_figure_later() -> None:
    """A shard worker's meter finds the end edge in a thread: the block is closed as it exits (the worker goes on to
    its next shard), and the figure, read later, is the aligned one."""
    meter, clock = counter_meter(STEPS, 2.004)
    meter.defer = True
    with meter.window() as w:
        clock.advance(0.25)
    assert w.closed and w.wall_seconds == pytest.approx(0.25, abs=1e-3)
    e = w.energy  # waits for the edge
    assert e is not None
    assert e.joules == pytest.approx(3 * 68.0, abs=1e-9) and e.seconds == pytest.approx(0.3, abs=0.002)
