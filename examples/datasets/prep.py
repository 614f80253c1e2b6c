"""Preprocesses for the digits CNN ([N, 1, 8, 8] float32 in [0, 1]): a batch of raw rows (a dict of NumPy arrays, as
Ray Data's map_batches gives it) to the model's inputs. They run on the node, streamed with the model."""

from __future__ import annotations

import numpy as np


def pixels(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Rows of 64 pixels (a Parquet column of fixed-size lists) as 8x8 images."""
    return batch["pixels"].reshape(-1, 1, 8, 8).astype(np.float32)


def images(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Decoded 8-bit grayscale images [N, 8, 8] as the model's [N, 1, 8, 8] in [0, 1]."""
    return (batch["image"].astype(np.float32) / 255.0)[:, None, :, :]
