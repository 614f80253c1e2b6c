"""Train the digits CNN and save the state_dict that `infer.yaml` serves.

Rerun from the repo root (about ten seconds on 2 CPU cores):

    python -m examples.digits.train              # writes examples/digits/weights.pt
    python -m examples.digits.train --epochs 1 --out /tmp/w.pt

Seeds are fixed, so a rerun with the same torch version reproduces the committed weights closely,
though not necessarily bit for bit across torch versions or machines.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from examples.digits import data
from examples.digits.model import build

DEFAULT_OUT = Path(__file__).resolve().parent / "weights.pt"
SEED = 0
BATCH_SIZE = 64
LEARNING_RATE = 1e-3


def accuracy(model: nn.Module, inputs: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of `inputs` whose argmax logit equals the label."""
    model.eval()
    with torch.no_grad():
        predictions = model(torch.from_numpy(inputs)).argmax(dim=1).numpy()
    return float((predictions == labels).mean())


def train(epochs: int, out: Path) -> float:
    """Train for `epochs`, save the state_dict to `out`, and return the test accuracy."""
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    rng = np.random.default_rng(SEED)

    x_train, y_train = data.train_set()
    x_test, y_test = data.test_set()
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss()
    inputs, labels = torch.from_numpy(x_train), torch.from_numpy(y_train)

    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.from_numpy(rng.permutation(len(inputs)))
        total = 0.0
        for start in range(0, len(order), BATCH_SIZE):
            batch = order[start : start + BATCH_SIZE]
            optimizer.zero_grad()
            loss = loss_fn(model(inputs[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        print(f"epoch {epoch:3d}  loss {total / len(order):.4f}")

    test_accuracy = accuracy(model, x_test, y_test)
    print(f"test accuracy {test_accuracy:.4f} ({len(y_test)} items)")

    # Contiguous float32 tensors, so nodes load them with weights_only=True on any backend.
    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    print(f"saved {out}")
    return test_accuracy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    train(args.epochs, args.out)
    print(f"wall time {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
