"""The digits CNN: [N, 1, 8, 8] float32 pixels in [0, 1] -> [N, 10] logits."""

from __future__ import annotations

from torch import nn


def build() -> nn.Module:
    """Return an untrained digits CNN; load `weights.pt` into it for inference."""
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )

