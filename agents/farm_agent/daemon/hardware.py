"""What this machine is: CPU, cores, memory, NVIDIA GPUs (through NVML) and, on a Mac, its Apple chip.

Runs in the agent daemon, which stays light: no torch here, and pynvml is imported only when GPUs are probed.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil

from farm.core.models import Gpu, Hardware

log = logging.getLogger("farm.agent.hardware")

# Runs a command and returns its stripped stdout; raises OSError or subprocess.SubprocessError when it cannot.
Runner = Callable[[Sequence[str]], str]
# Returns the NVIDIA GPUs found and, when there are none, why.
GpuProbe = Callable[[], tuple[tuple[Gpu, ...], str]]

COMMAND_TIMEOUT_S = 5.0

# /proc/cpuinfo on arm64 names no model, only the implementer and part numbers (from the MIDR register).
ARM_PARTS: dict[tuple[str, str], str] = {
    ("0x41", "0xd03"): "ARM Cortex-A53",
    ("0x41", "0xd07"): "ARM Cortex-A57",
    ("0x41", "0xd08"): "ARM Cortex-A72",
    ("0x41", "0xd0b"): "ARM Cortex-A76",
    ("0x41", "0xd0c"): "ARM Neoverse-N1",
    ("0x41", "0xd40"): "ARM Neoverse-V1",
    ("0x41", "0xd49"): "ARM Neoverse-N2",
    ("0x41", "0xd4f"): "ARM Neoverse-V2",
    ("0xc0", "0xac3"): "AmpereOne",
}


class NvmlMemory(Protocol):
    @property
    def total(self) -> int: ...


class Nvml(Protocol):
    """The part of pynvml (nvidia-ml-py) used here; tests pass a fake that replays a recording."""

    @property
    def NVMLError(self) -> type[Exception]: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> NvmlMemory: ...


def cpuinfo_fields(text: str) -> dict[str, str]:
    """The first value of each `key : value` line of a /proc/cpuinfo text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model_from_cpuinfo(text: str) -> str:
    """The CPU model a /proc/cpuinfo text names, or "" when it names none."""
    fields = cpuinfo_fields(text)
    if fields.get("model name"):
        return fields["model name"]
    # ARM boards: name the core, and the board (Raspberry Pi "Model", else the SoC "Hardware") beside it.
    implementer, part = fields.get("CPU implementer", "").lower(), fields.get("CPU part", "").lower()
    core = ARM_PARTS.get((implementer, part), "")
    if not core and fields.get("Processor"):  # 32-bit ARM kernels; x86's lowercase "processor" is only an index
        core = fields["Processor"]
    if not core and part:
        core = f"ARM CPU implementer {implementer or '?'} part {part}"
    board = fields.get("Model") or fields.get("Hardware") or ""
    if core and board:
        return f"{core} ({board})"
    return core or board


def apple_chip_from_brand(brand: str) -> str:
    """The Apple chip a macOS CPU brand string names ("Apple M2 Pro"), or "" on an Intel Mac."""
    return brand if brand.startswith("Apple ") else ""


def run_command(args: Sequence[str], timeout: float = COMMAND_TIMEOUT_S) -> str:
    """The stripped stdout of a command; raises OSError or subprocess.SubprocessError when it fails."""
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=True)
    return done.stdout.strip()


def mac_cpu_brand(run: Runner = run_command) -> str:
    """`sysctl -n machdep.cpu.brand_string` ("Apple M2 Pro"), or "" (logged) when sysctl fails."""
    try:
        return run(["sysctl", "-n", "machdep.cpu.brand_string"])
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not read the CPU brand with sysctl: %s", exc)
        return ""


def linux_cpu_model(root: Path = Path("/")) -> str:
    """The CPU model from `root`/proc/cpuinfo, or "" (logged when the file cannot be read)."""
    path = root / "proc" / "cpuinfo"
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        log.warning("could not read %s: %s", path, exc)
        return ""
    return cpu_model_from_cpuinfo(text)


def cpu_model_and_chip(system: str, root: Path = Path("/"), run: Runner = run_command) -> tuple[str, str]:
    """(cpu_model, apple_chip) for a platform.system().lower() value; the model is never empty."""
    model, chip = "", ""
    if system == "darwin":
        model = mac_cpu_brand(run)
        chip = apple_chip_from_brand(model)
    elif system == "linux":
        model = linux_cpu_model(root)
    return model or platform.processor() or "unknown", chip


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str on Python 3 today; older releases (and the old `pynvml` package) returned bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def gpus_from_nvml(nvml: Nvml) -> tuple[Gpu, ...]:
    """The GPUs NVML reports, by NVML index; NVML errors propagate (as nvml.NVMLError)."""
    nvml.nvmlInit()
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(Gpu(
                index=index, name=_text(nvml.nvmlDeviceGetName(handle)), uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total), driver=driver,
            ))
        return tuple(gpus)
    finally:
        nvml.nvmlShutdown()


def nvidia_gpus_from(nvml: Nvml) -> tuple[tuple[Gpu, ...], str]:
    """(gpus, why there are none): NVML failing (no driver, as on a Mac or a CPU box) is an answer, not an error."""
    try:
        gpus = gpus_from_nvml(nvml)
    except nvml.NVMLError as exc:
        return (), f"NVML: {exc}"
    return gpus, "" if gpus else "NVML found no GPUs"


def nvidia_gpus() -> tuple[tuple[Gpu, ...], str]:
    """(gpus, why there are none) on this machine, through pynvml from the nvidia-ml-py package."""
    try:
        import pynvml
    except ImportError as exc:
        return (), f"nvidia-ml-py not installed ({exc})"
    return nvidia_gpus_from(pynvml)


def detect(
    root: Path = Path("/"),
    *,
    system: str | None = None,
    run: Runner = run_command,
    nvidia: GpuProbe | None = None,
) -> Hardware:
    """This machine's hardware. GPUs come from `nvidia` (default: nvidia_gpus); call that for why there are none."""
    system = system if system is not None else platform.system().lower()
    cpu_model, apple_chip = cpu_model_and_chip(system, root, run)
    gpus, _ = (nvidia or nvidia_gpus)()
    return Hardware(
        hostname=platform.node(), os=system, arch=platform.machine(), cpu_model=cpu_model,
        cpu_cores=os.cpu_count() or 1, memory_bytes=psutil.virtual_memory().total, gpus=gpus, apple_chip=apple_chip,
    )
