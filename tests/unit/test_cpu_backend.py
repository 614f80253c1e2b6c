"""The cpu backend hands the model its batch's memory: a read-only batch (Arrow's buffers, a mapped file) is copied
first, so that a model writing its input in place changes nothing of the dataset's, and PyTorch has nothing to warn
about (its "non-writable tensors" warning reached every CPU job's log)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from farm_agent.backends import cpu


class AddsInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1)


def test_a_model_writing_its_input_leaves_a_read_only_batch_as_it_was() -> None:
    source = np.arange(12, dtype=np.float32).tobytes()
    inputs = np.frombuffer(source, dtype=np.float32).reshape(6, 2)  # read-only, as Arrow's zero-copy views are
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch's warning on a non-writable array fails the test
        outputs = cpu.run(AddsInPlace(), inputs, batch_size=4, device="cpu", threads=1)
    np.testing.assert_array_equal(outputs, np.arange(12, dtype=np.float32).reshape(6, 2) + 1)
    assert np.frombuffer(source, dtype=np.float32).tolist() == list(range(12))  # the source unchanged


def test_a_writable_batch_is_not_copied() -> None:
    inputs = np.zeros((4, 2), dtype=np.float32)
    cpu.run(AddsInPlace(), inputs, batch_size=4, device="cpu", threads=1)
    assert inputs.tolist() == [[1.0, 1.0]] * 4  # the job's own array: its memory, as before
