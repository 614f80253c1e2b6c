"""Write this example's datasets from scikit-learn's bundled digits (offline, real): the 540 held-out digits of
examples/digits (the same split) as

    examples/datasets/data/digits-parquet/   3 Parquet files: `pixels` (64 float32 a row, in [0, 1]), `label`, `index`
    examples/datasets/data/digits-images/    540 8x8 grayscale PNGs, <index>-<label>.png

Run from the repository root: python examples/datasets/make.py [--out FOLDER]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def write(out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    sys.path.insert(0, str(HERE.parents[1]))
    from examples.digits.data import test_set

    inputs, labels = test_set()  # [540, 1, 8, 8] float32 in [0, 1], [540] int64
    pixels = inputs.reshape(len(inputs), 64)
    parquet = out / "digits-parquet"
    parquet.mkdir(parents=True, exist_ok=True)
    for part, rows in enumerate(np.array_split(np.arange(len(inputs)), 3)):
        pq.write_table(pa.table({
            "pixels": pa.FixedSizeListArray.from_arrays(pa.array(pixels[rows].reshape(-1)), 64),
            "label": pa.array(labels[rows]),
            "index": pa.array(rows),
        }), parquet / f"part-{part}.parquet", row_group_size=64)
    images = out / "digits-images"
    images.mkdir(parents=True, exist_ok=True)
    for index, (image, label) in enumerate(zip(inputs[:, 0], labels)):
        Image.fromarray(np.round(image * 255).astype(np.uint8), mode="L").save(images / f"{index:03d}-{label}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "data")
    args = parser.parse_args()
    write(args.out)
    print(f"wrote {args.out / 'digits-parquet'} and {args.out / 'digits-images'}")


if __name__ == "__main__":
    main()
