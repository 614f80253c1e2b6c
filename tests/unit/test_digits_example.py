"""The digits example job: committed weights, the dataset split, and the training script."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
# `examples` is not an installed package; plain `pytest` (unlike `python -m pytest`) would not find it.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Imported as a module, not `from ... import test_set`, which pytest would collect as a test.
from examples.digits import data  # noqa: E402
from examples.digits.model import build  # noqa: E402

WEIGHTS = ROOT / "examples" / "digits" / "weights.pt"
TOTAL, TRAIN, TEST = 1797, 1257, 540


def _predict(model: torch.nn.Module, inputs: np.ndarray, batch_size: int = 64) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        batches = [model(torch.from_numpy(inputs[i : i + batch_size])) for i in range(0, len(inputs), batch_size)]
    return torch.cat(batches).argmax(dim=1).numpy()


def test_committed_weights_load_strictly_and_reach_the_acceptance_bar() -> None:
    model = build()
    model.load_state_dict(torch.load(WEIGHTS, map_location="cpu", weights_only=True), strict=True)
    inputs, labels = data.test_set()

    predictions = _predict(model, inputs)

    assert predictions.shape == (TEST,) == labels.shape
    accuracy = float((predictions == labels).mean())
    assert accuracy >= 0.90, accuracy


def test_committed_weights_are_small_contiguous_float32() -> None:
    state = torch.load(WEIGHTS, map_location="cpu", weights_only=True)
    assert WEIGHTS.stat().st_size < 200_000
    assert state.keys() == build().state_dict().keys()
    for name, tensor in state.items():
        assert tensor.dtype == torch.float32, name
        assert tensor.is_contiguous(), name


def test_split_shapes_dtypes_and_ranges() -> None:
    for (inputs, labels), size in ((data.train_set(), TRAIN), (data.test_set(), TEST)):
        assert inputs.shape == (size, 1, 8, 8)
        assert inputs.dtype == np.float32
        assert labels.shape == (size,)
        assert labels.dtype == np.int64
        assert 0.0 <= inputs.min() and inputs.max() <= 1.0
        assert inputs.max() == 1.0  # scaled by 16, not left at 0..16 nor squashed further
        assert set(np.unique(labels)) == set(range(10))


def test_split_is_disjoint_and_covers_the_dataset() -> None:
    train_inputs, _ = data.train_set()
    test_inputs, _ = data.test_set()
    assert len(train_inputs) + len(test_inputs) == TOTAL
    train_images = {image.tobytes() for image in train_inputs}
    assert not any(image.tobytes() in train_images for image in test_inputs)


def test_split_is_deterministic() -> None:
    for first, second in ((data.train_set(), data.train_set()), (data.test_set(), data.test_set())):
        np.testing.assert_array_equal(first[0], second[0])
        np.testing.assert_array_equal(first[1], second[1])


def test_infer_spec_points_at_the_example() -> None:
    spec = yaml.safe_load((ROOT / "examples" / "digits" / "infer.yaml").read_text())
    assert (ROOT / spec["weights"]).is_file()
    for ref in (spec["model"], spec["dataset"]):
        module, name = ref.split(":")
        assert callable(getattr(importlib.import_module(module), name))


@pytest.mark.timeout(120)
def test_train_script_writes_a_loadable_state_dict(tmp_path: Path) -> None:
    out = tmp_path / "w.pt"
    result = subprocess.run(
        [sys.executable, "-m", "examples.digits.train", "--epochs", "1", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert "epoch   1" in result.stdout and "test accuracy" in result.stdout
    build().load_state_dict(torch.load(out, map_location="cpu", weights_only=True), strict=True)
