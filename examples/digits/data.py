"""Deterministic train/test split of scikit-learn's bundled digits (1797 8x8 images, offline).

Farm's dataset contract: a callable returning inputs, or (inputs, labels), indexed along the first axis.
"""

from __future__ import annotations

import numpy as np

TEST_SIZE = 0.3
SEED = 0


def _split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # sklearn is imported here so that importing this module (done on every node) stays cheap.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    inputs = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        inputs, labels, test_size=TEST_SIZE, random_state=SEED, stratify=labels
    )
    return (
        np.ascontiguousarray(x_train),
        np.ascontiguousarray(x_test),
        np.ascontiguousarray(y_train),
        np.ascontiguousarray(y_test),
    )


def train_set() -> tuple[np.ndarray, np.ndarray]:
    """Training inputs [1257, 1, 8, 8] float32 in [0, 1] and labels [1257] int64."""
    x_train, _, y_train, _ = _split()
    return x_train, y_train


def test_set() -> tuple[np.ndarray, np.ndarray]:
    """Test inputs [540, 1, 8, 8] float32 in [0, 1] and labels [540] int64."""
    _, x_test, _, y_test = _split()
    return x_test, y_test
