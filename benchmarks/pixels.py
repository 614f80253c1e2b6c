"""The data-plane benchmarks' model and data: scikit-learn's bundled digits (offline, real), grown to any number of
rows, in a Parquet folder; the digits CNN (examples/digits, its committed weights) reading each row's 64 pixels.

    build()                          the model: [N, 64] float32 pixels -> [N, 10] logits (a job's `model:`)
    write_dataset(FOLDER, ROWS)      ROWS rows in FILES Parquet files: `pixels` (64 float32 a row), `label`, `digit`

A row is digit (row mod 1,797) of the bundled set plus seeded noise (sd 0.05, clipped to [0, 1]): every row is a real
digit, no two alike, and the same rows come back for the same ROWS and seed, so each side of a benchmark reads the
same data. Row groups of 16,384 rows, zstd: a shard reads only the groups holding its rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from examples.digits.model import build as digits_cnn

WEIGHTS = Path(__file__).resolve().parents[1] / "examples" / "digits" / "weights.pt"
PIXELS = 64
ROW_GROUP = 16_384


class PixelsCNN(nn.Module):
    """The digits CNN on rows of 64 pixels (a Parquet column of fixed-size lists), as the data plane hands them."""

    def __init__(self) -> None:
        super().__init__()
        self.net = digits_cnn()

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net(pixels.reshape(-1, 1, 8, 8))


def build() -> nn.Module:
    model = PixelsCNN()
    model.net.load_state_dict(torch.load(WEIGHTS, map_location="cpu", weights_only=True))
    return model.eval()


def write_dataset(folder: Path, rows: int, files: int = 8, seed: int = 0) -> Path:
    """ROWS rows over FILES Parquet files in FOLDER (made; files already there with the same name are replaced)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_digits

    digits = load_digits()
    base = (digits.images.reshape(-1, PIXELS) / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_file = -(-rows // files)
    for index, start in enumerate(range(0, rows, per_file)):
        ids = np.arange(start, min(start + per_file, rows))
        pixels = np.clip(base[ids % len(base)] + rng.normal(0, 0.05, (len(ids), PIXELS)).astype(np.float32), 0, 1)
        table = pa.table({
            "pixels": pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1), pa.float32()), PIXELS),
            "label": pa.array(labels[ids % len(base)]),
            "digit": pa.array(ids % len(base)),
        })
        pq.write_table(table, folder / f"part-{index:03d}.parquet", row_group_size=ROW_GROUP, compression="zstd")
    return folder
