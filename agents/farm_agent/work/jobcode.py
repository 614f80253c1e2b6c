"""Loading a job's model and dataset from its code (the job's working directory)."""

from __future__ import annotations

import importlib
import sys
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from farm.core.errors import SpecError

if TYPE_CHECKING:
    import torch


def _call(path: str, root: Path, what: str) -> Any:
    target = resolve(path, root, what)
    try:
        return target()
    except Exception as exc:
        raise SpecError(f"{what} {path!r} raised {type(exc).__name__}: {exc}") from None


def resolve(path: str, root: Path, what: str) -> Any:
    """The callable `package.module:name` names, imported from the job's code under `root`."""
    module_name, _, attr = path.partition(":")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise SpecError(f"{what} {path!r} does not import: {type(exc).__name__}: {exc}") from None
    target = getattr(module, attr, None)
    if not callable(target):
        raise SpecError(f"{what} {path!r}: {module_name} has no callable {attr!r}")
    return target


def _as_array(value: Any, what: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.ndim == 0 or array.dtype == object:
        raise SpecError(f"{what} is not an array of items")
    return array


@lru_cache(maxsize=4)
def load_dataset(dataset: str, root: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """(inputs, labels or None) from `module:callable` or a .npy/.npz/.pt file under `root`.

    A callable (or a .pt file) gives an array of inputs, or a pair (inputs, labels). An .npz holds `inputs` or `x`,
    and optionally `labels` or `y`.
    """
    if dataset.endswith((".npy", ".npz", ".pt")):
        path = root / dataset
        if not path.is_file():
            raise SpecError(f"dataset file {dataset!r} not found under {root}")
        try:
            value = _read_file(path)
        except Exception as exc:
            raise SpecError(f"dataset {dataset!r} does not load: {type(exc).__name__}: {exc}") from None
    else:
        value = _call(dataset, root, "dataset")
    if isinstance(value, (tuple, list)) and len(value) == 2:
        inputs, labels = _as_array(value[0], "dataset inputs"), _as_array(value[1], "dataset labels")
        if len(labels) != len(inputs):
            raise SpecError(f"dataset {dataset!r}: {len(inputs)} inputs but {len(labels)} labels")
        return inputs, labels
    return _as_array(value, f"dataset {dataset!r}"), None


def _read_file(path: Path) -> Any:
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            inputs = next((data[k] for k in ("inputs", "x") if k in data), None)
            if inputs is None:
                raise ValueError("an .npz dataset needs an 'inputs' or 'x' array")
            labels = next((data[k] for k in ("labels", "y") if k in data), None)
            return inputs if labels is None else (inputs, labels)
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


@lru_cache(maxsize=4)
def load_model(model: str, weights: str | None, root: Path) -> torch.nn.Module:
    """The model for inference, built once per worker process (shards of one job share it read-only)."""
    return build_model(model, weights, root)


def build_model(model: str, weights: str | None, root: Path) -> torch.nn.Module:
    """A fresh model of its own (training changes it), with `weights` loaded when given."""
    import torch

    module = _call(model, root, "model")
    if not isinstance(module, torch.nn.Module):
        raise SpecError(f"model {model!r} returned {type(module).__name__}, not a torch.nn.Module")
    if weights:
        path = root / weights
        if not path.is_file():
            raise SpecError(f"weights {weights!r} not found under {root}")
        try:
            module.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        except Exception as exc:
            raise SpecError(f"weights {weights!r} do not fit the model: {type(exc).__name__}: {exc}") from None
    return module.eval()

