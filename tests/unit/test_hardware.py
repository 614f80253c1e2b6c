"""Hardware detection of the agent: parsers on recorded inputs, NVML through a replayed fake, and one real detect()."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from farm.core.models import Gpu, Hardware
from farm_agent.daemon import hardware
from farm_agent.daemon.hardware import (
    apple_chip_from_brand,
    cpu_model_from_cpuinfo,
    cpuinfo_fields,
    detect,
    gpus_from_nvml,
    nvidia_gpus,
    nvidia_gpus_from,
    run_command,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HARDWARE = FIXTURES / "hardware"
NODES = FIXTURES / "nodes"
ROOT = Path(__file__).resolve().parents[2]


class FakeNvmlError(Exception):
    """Stands in for pynvml.NVMLError, whose str() is NVML's own message ("Driver Not Loaded")."""


class FakeNvml:
    """Replays a recording of pynvml answers (tests/fixtures/hardware/nvml-*.json) and logs each call."""

    NVMLError = FakeNvmlError

    def __init__(
        self, recording: dict[str, Any], *, as_bytes: bool = False, fail: dict[str, str] | None = None
    ) -> None:
        self.recording = recording
        self.as_bytes = as_bytes  # older pynvml releases returned bytes
        self.fail = fail or {}  # call name -> the NVML message it raises
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise FakeNvmlError(self.fail[name])

    def _out(self, value: str) -> str | bytes:
        return value.encode() if self.as_bytes else value

    def _device(self, handle: tuple[str, int]) -> dict[str, Any]:
        assert handle[0] == "handle", f"not a handle: {handle!r}"
        device: dict[str, Any] = self.recording["devices"][handle[1]]
        return device

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._call("nvmlSystemGetDriverVersion")
        return self._out(self.recording["nvmlSystemGetDriverVersion"])

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        count: int = self.recording["nvmlDeviceGetCount"]
        return count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        self._call("nvmlDeviceGetHandleByIndex")
        return ("handle", index)

    def nvmlDeviceGetName(self, handle: tuple[str, int]) -> str | bytes:
        self._call("nvmlDeviceGetName")
        return self._out(self._device(handle)["nvmlDeviceGetName"])

    def nvmlDeviceGetUUID(self, handle: tuple[str, int]) -> str | bytes:
        self._call("nvmlDeviceGetUUID")
        return self._out(self._device(handle)["nvmlDeviceGetUUID"])

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[str, int]) -> SimpleNamespace:
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(**self._device(handle)["nvmlDeviceGetMemoryInfo"])


def recording(name: str = "nvml-h200x2.json") -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((HARDWARE / name).read_text())
    return loaded


def node(name: str) -> Hardware:
    return Hardware.model_validate_json((NODES / f"{name}.json").read_text())


def fake_root(tmp_path: Path, cpuinfo: str) -> Path:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text((HARDWARE / cpuinfo).read_text())
    return tmp_path


# --- /proc/cpuinfo ---


def test_cpuinfo_x86_names_the_model() -> None:
    assert cpu_model_from_cpuinfo((HARDWARE / "cpuinfo-x86.txt").read_text()) == "INTEL(R) XEON(R) PLATINUM 8558"


def test_cpuinfo_arm64_names_the_core_and_the_board() -> None:
    text = (HARDWARE / "cpuinfo-arm64.txt").read_text()
    assert "model name" not in text
    assert cpu_model_from_cpuinfo(text) == "ARM Cortex-A72 (Raspberry Pi 4 Model B Rev 1.4)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Ampere Altra: no model name, no board lines.
        ("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n", "ARM Neoverse-N1"),
        # A core not in the table still says what it is.
        ("processor\t: 0\nCPU implementer\t: 0x61\nCPU part\t: 0x033\n", "ARM CPU implementer 0x61 part 0x033"),
        # Old 32-bit kernels: "Processor" and "Hardware".
        (
            "Processor\t: ARMv7 Processor rev 5 (v7l)\nprocessor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xc07\n"
            "Hardware\t: BCM2709\n",
            "ARMv7 Processor rev 5 (v7l) (BCM2709)",
        ),
        ("Hardware\t: Qualcomm Technologies, Inc SM8250\n", "Qualcomm Technologies, Inc SM8250"),
        # x86's lowercase "processor" is an index, never a model.
        ("processor\t: 0\nvendor_id\t: GenuineIntel\n", ""),
        ("", ""),
    ],
)
def test_cpuinfo_without_model_name(text: str, expected: str) -> None:
    assert cpu_model_from_cpuinfo(text) == expected


def test_cpuinfo_fields_keep_the_first_value_and_colons_in_values() -> None:
    fields = cpuinfo_fields("processor\t: 0\nmodel name\t: A: B\n\nprocessor\t: 1\nmodel name\t: C\n")
    assert fields == {"processor": "0", "model name": "A: B"}


# --- NVML ---


def test_gpus_from_nvml_replays_the_recorded_h200x2_box() -> None:
    nvml = FakeNvml(recording())
    gpus = gpus_from_nvml(nvml)
    assert gpus == node("h200x2-box").gpus
    assert [(g.index, g.name, g.memory_bytes, g.driver) for g in gpus] == [
        (0, "NVIDIA H200", 150754820096, "580.95.05"),
        (1, "NVIDIA H200", 150754820096, "580.95.05"),
    ]
    assert gpus[0].uuid != gpus[1].uuid
    assert nvml.calls[0] == "nvmlInit"
    assert nvml.calls[-1] == "nvmlShutdown"
    assert nvml.calls.count("nvmlShutdown") == 1


def test_gpus_from_nvml_replays_a_real_h200_recording() -> None:
    # Recorded on a lent single-H200 machine (nvidia-ml-py 13.610.43); real NVML returned str, not bytes.
    assert gpus_from_nvml(FakeNvml(recording("nvml-h200.json"))) == (
        Gpu(index=0, name="NVIDIA H200", uuid="GPU-d9f13f7d-3950-ce17-6430-74d61c271fe7", memory_bytes=150754820096,
            driver="580.159.04"),
    )


def test_gpus_from_nvml_decodes_bytes() -> None:
    gpus = gpus_from_nvml(FakeNvml(recording(), as_bytes=True))
    assert gpus == node("h200x2-box").gpus
    assert all(isinstance(g.name, str) and isinstance(g.uuid, str) for g in gpus)


def test_nvml_is_shut_down_when_a_device_call_raises() -> None:
    nvml = FakeNvml(recording(), fail={"nvmlDeviceGetUUID": "GPU is lost"})
    with pytest.raises(FakeNvmlError, match="GPU is lost"):
        gpus_from_nvml(nvml)
    assert nvml.calls[-1] == "nvmlShutdown"
    # The same failure, seen by the caller that must not crash, is a reason.
    assert nvidia_gpus_from(FakeNvml(recording(), fail={"nvmlDeviceGetUUID": "GPU is lost"})) == (
        (), "NVML: GPU is lost"
    )


def test_nvml_without_a_driver_gives_no_gpus_and_says_why() -> None:
    nvml = FakeNvml(recording(), fail={"nvmlInit": "Driver Not Loaded"})
    assert nvidia_gpus_from(nvml) == ((), "NVML: Driver Not Loaded")
    assert nvml.calls == ["nvmlInit"]  # no shutdown of what never started


def test_nvml_with_no_devices_says_so() -> None:
    nvml = FakeNvml({**recording(), "nvmlDeviceGetCount": 0})
    gpus, reason = nvidia_gpus_from(nvml)
    assert gpus == ()
    assert reason == "NVML found no GPUs"
    assert nvml.calls[-1] == "nvmlShutdown"


def test_nvml_found_gives_no_reason() -> None:
    gpus, reason = nvidia_gpus_from(FakeNvml(recording()))
    assert len(gpus) == 2
    assert reason == ""


def test_missing_nvidia_ml_py_gives_no_gpus_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    gpus, reason = nvidia_gpus()
    assert gpus == ()
    assert reason.startswith("nvidia-ml-py not installed")


def test_real_nvml_gives_gpus_or_a_reason() -> None:
    gpus, reason = nvidia_gpus()
    if gpus:
        assert reason == ""
        assert [g.index for g in gpus] == list(range(len(gpus)))
        assert all(g.name and g.memory_bytes > 0 and g.driver for g in gpus)
    else:
        assert reason.startswith(("NVML", "nvidia-ml-py not installed")), reason


# --- macOS ---


def fake_sysctl(answers: dict[str, str]) -> tuple[list[list[str]], hardware.Runner]:
    seen: list[list[str]] = []

    def run(args: Sequence[str]) -> str:
        seen.append(list(args))
        assert list(args[:2]) == ["sysctl", "-n"], args
        return answers[args[2]]

    return seen, run


def test_detect_on_an_apple_silicon_mac() -> None:
    seen, run = fake_sysctl({"machdep.cpu.brand_string": "Apple M2 Pro"})
    hw = detect(system="darwin", run=run, nvidia=lambda: ((), "nvidia-ml-py not installed"))
    assert seen == [["sysctl", "-n", "machdep.cpu.brand_string"]]
    assert (hw.os, hw.cpu_model, hw.apple_chip, hw.gpus) == ("darwin", "Apple M2 Pro", "Apple M2 Pro", ())


def test_an_intel_mac_has_no_apple_chip() -> None:
    brand = "Intel(R) Core(TM) i9-9880H CPU @ 2.30GHz"
    assert apple_chip_from_brand(brand) == ""
    _, run = fake_sysctl({"machdep.cpu.brand_string": brand})
    hw = detect(system="darwin", run=run, nvidia=lambda: ((), ""))
    assert (hw.cpu_model, hw.apple_chip) == (brand, "")


@pytest.mark.parametrize(
    "error", [FileNotFoundError("sysctl"), subprocess.TimeoutExpired(["sysctl"], 5.0)], ids=["missing", "timeout"]
)
def test_sysctl_failing_falls_back_and_logs(error: Exception, caplog: pytest.LogCaptureFixture) -> None:
    def run(args: Sequence[str]) -> str:
        raise error

    with caplog.at_level(logging.WARNING, logger="farm.agent.hardware"):
        hw = detect(system="darwin", run=run, nvidia=lambda: ((), ""))
    assert hw.apple_chip == ""
    assert hw.cpu_model == (platform.processor() or "unknown")
    assert "sysctl" in caplog.text


def test_linux_never_runs_sysctl(tmp_path: Path) -> None:
    def run(args: Sequence[str]) -> str:
        raise AssertionError(f"ran {args}")

    hw = detect(fake_root(tmp_path, "cpuinfo-x86.txt"), system="linux", run=run, nvidia=lambda: ((), ""))
    assert hw.apple_chip == ""


def test_run_command_returns_stripped_stdout_and_times_out() -> None:
    assert run_command([sys.executable, "-c", "print('  Apple M2 Pro  ')"]) == "Apple M2 Pro"
    with pytest.raises(subprocess.TimeoutExpired):
        run_command([sys.executable, "-c", "import time; time.sleep(10)"], timeout=0.2)
    with pytest.raises(subprocess.CalledProcessError):
        run_command([sys.executable, "-c", "raise SystemExit(3)"])


# --- detect() ---


def test_detect_reads_the_proc_tree_under_root(tmp_path: Path) -> None:
    probe_gpus = node("h200x2-box").gpus
    hw = detect(fake_root(tmp_path, "cpuinfo-arm64.txt"), system="linux", nvidia=lambda: (probe_gpus, ""))
    assert hw.cpu_model == "ARM Cortex-A72 (Raspberry Pi 4 Model B Rev 1.4)"
    assert hw.gpus == probe_gpus
    assert (hw.os, hw.apple_chip) == ("linux", "")
    assert hw.cpu_cores == os.cpu_count()
    assert hw.memory_bytes == psutil.virtual_memory().total
    assert Hardware.model_validate_json(hw.model_dump_json()) == hw


@pytest.mark.parametrize(("processor", "expected"), [("x86_64", "x86_64"), ("", "unknown")])
def test_detect_without_cpuinfo_falls_back_and_logs(
    processor: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(platform, "processor", lambda: processor)
    with caplog.at_level(logging.WARNING, logger="farm.agent.hardware"):
        hw = detect(tmp_path, system="linux", nvidia=lambda: ((), ""))
    assert hw.cpu_model == expected
    assert str(tmp_path / "proc" / "cpuinfo") in caplog.text


@pytest.mark.parametrize(("count", "expected"), [(96, 96), (None, 1)])
def test_detect_counts_logical_cores(
    count: int | None, expected: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: count)
    hw = detect(fake_root(tmp_path, "cpuinfo-x86.txt"), system="linux", nvidia=lambda: ((), ""))
    assert hw.cpu_cores == expected


def test_detect_on_this_machine() -> None:
    hw = detect()
    gpus, reason = nvidia_gpus()
    assert hw.cpu_cores == os.cpu_count()
    assert hw.memory_bytes > 0
    assert hw.os == platform.system().lower()
    assert hw.arch == platform.machine()
    assert hw.hostname == platform.node()
    assert hw.cpu_model
    assert len(hw.gpus) == len(gpus)
    assert bool(reason) != bool(hw.gpus)


def test_the_daemon_module_stays_light() -> None:
    # torch must never load in the agent daemon, and pynvml only when GPUs are probed.
    code = (
        "import sys\n"
        "import farm_agent.daemon.hardware as h\n"
        "assert 'pynvml' not in sys.modules, 'pynvml imported at module import'\n"
        "h.detect()\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    path = [str(ROOT / "agents"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# --- recorded nodes, shared with the scheduler tests ---


def test_every_node_fixture_is_a_valid_hardware() -> None:
    paths = sorted(NODES.glob("*.json"))
    assert {p.stem for p in paths} >= {"h200-box", "h200x2-box", "m2-pro-mac", "laptop-cpu"}
    for path in paths:
        raw = json.loads(path.read_text())
        hw = Hardware.model_validate(raw)
        assert hw.model_dump(mode="json") == raw, f"{path.name} is not a model_dump snapshot"
        assert [g.index for g in hw.gpus] == list(range(len(hw.gpus))), path.name
        assert hw.os in ("linux", "darwin"), path.name
        assert bool(hw.apple_chip) == (hw.os == "darwin" and hw.arch == "arm64"), path.name


def test_node_fixtures_describe_the_machines_they_are_named_for() -> None:
    h200, h200x2, mac, laptop = (node(n) for n in ("h200-box", "h200x2-box", "m2-pro-mac", "laptop-cpu"))
    assert h200.gpus == (Gpu(index=0, name="NVIDIA H200", uuid=h200.gpus[0].uuid, memory_bytes=150754820096,
                             driver="580.95.05"),)
    assert h200.gpus[0].uuid.startswith("GPU-")
    assert [g.name for g in h200x2.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert (mac.os, mac.arch, mac.cpu_model, mac.apple_chip, mac.cpu_cores, mac.memory_bytes) == (
        "darwin", "arm64", "Apple M2 Pro", "Apple M2 Pro", 12, 32 * 2**30
    )
    assert (laptop.gpus, laptop.cpu_cores, laptop.os) == ((), 8, "linux")
    assert "i7-1185G7" in laptop.cpu_model


def test_the_agent_daemon_never_imports_torch() -> None:
    # Shards run in Ray workers; the daemon on someone's laptop must stay light.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from farm_agent import backends\nfrom farm_agent.daemon import main\n"
        "from farm_agent.daemon.hardware import detect\n"
        "hw = detect()\n"
        "backends.offers(hw, 1)\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
