"""The tuner's winners, cached per (GPU name, driver, torch version, model hash, input shapes, tolerance, objective).

A winner measured on one GPU, driver or torch version says nothing sure about another, so each is part of the key;
so are the model (its structure and weights, hashed), the shapes and types of its inputs, the tolerance it was
judged under and the objective it was ranked by (the fastest candidate need not spend the fewest joules). One JSON
file per key under FARM_STATE_DIR/tuner/cache/ (default ~/.farm), written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from farm.core.tuning import Objective

def default_dir() -> Path:
    return Path(os.environ.get("FARM_STATE_DIR", Path.home() / ".farm")) / "tuner" / "cache"


@dataclass(frozen=True)
class CacheKey:
    device_name: str
    driver: str
    torch_version: str
    model_hash: str
    input_shapes: tuple[str, ...]  # "float32[64, 3, 32, 32]" per input
    atol: float
    rtol: float
    objective: str = Objective.TIME.value  # farm.core.tuning.Objective

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Winner:
    """The fastest correct candidate for one key, with what it was measured against."""

    candidate: str  # a family name (candidates.FAMILIES), which is also its transform; or "proposed:<name>"
    params: dict[str, Any]
    lowers_precision: bool
    median_ms: float
    eager_ms: float | None
    compile_ms: float | None
    # A proposed winner (farm kernels propose): the candidate file's source, defining ModelNew. No transform builds
    # it; it is kept for whoever reuses the problem's winner.
    source: str | None = None
    joules_per_call: float | None = None  # above idle, on the device's energy counter (None: not measured)
    baseline: str = "eager"  # what the job runs untuned (farm_agent.tuner.tune.baseline_for), which it had to beat
    baseline_ms: float | None = None
    baseline_joules: float | None = None


def _nvml_driver() -> str | None:
    try:
        import pynvml
    except ImportError:  # nvidia-ml-py is the `cuda` extra: without it, the CUDA runtime version stands in
        return None
    try:
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except pynvml.NVMLError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_identity(device: str | torch.device) -> tuple[str, str]:
    """(device name, driver) of the device a winner is measured on."""
    dev = torch.device(device)
    if dev.type == "cuda":
        driver = _nvml_driver() or f"cuda-runtime-{torch.version.cuda}"
        return torch.cuda.get_device_name(dev), driver
    return _cpu_name(), "none"


def model_hash(model: torch.nn.Module) -> str:
    """The model's class, structure and every parameter and buffer (names, types, shapes, values)."""
    digest = hashlib.sha256()
    digest.update(f"{type(model).__module__}.{type(model).__qualname__}\n{model!r}".encode())
    for name, tensor in model.state_dict().items():
        t = tensor.detach()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


def input_signature(inputs: Sequence[Any]) -> tuple[str, ...]:
    return tuple(f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}" if isinstance(x, torch.Tensor)
                 else f"{type(x).__name__}:{x!r}" for x in inputs)


def make_key(model: torch.nn.Module, inputs: Sequence[Any], atol: float, rtol: float,
             device: str | torch.device, objective: Objective = Objective.TIME) -> CacheKey:
    name, driver = device_identity(device)
    return CacheKey(device_name=name, driver=driver, torch_version=torch.__version__, model_hash=model_hash(model),
                    input_shapes=input_signature(inputs), atol=atol, rtol=rtol, objective=objective.value)


class WinnerCache:
    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder or default_dir()

    def _path(self, key: CacheKey) -> Path:
        return self.folder / f"{key.digest()}.json"

    def get(self, key: CacheKey) -> Winner | None:
        path = self._path(key)
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        if data.get("key") != json.loads(json.dumps(asdict(key))):  # a digest collision, or a hand-edited file
            return None
        return Winner(**data["winner"])

    def put(self, key: CacheKey, winner: Winner, extra: dict[str, Any] | None = None) -> Path:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": asdict(key), "winner": asdict(winner), **(extra or {})}, indent=1))
        os.replace(tmp, path)
        return path
