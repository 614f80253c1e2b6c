"""The FLOPs of a reference run: PyTorch's FlopCounterMode, with formulas for the ops it has none for.

torch.cdist reaches the dispatcher as aten._euclidean_dist (its matrix form, p = 2) or aten._cdist_forward, and
FlopCounterMode counts neither: a problem of pairwise distances then had a speed of light from its bytes alone (an
8192 x 8192 x 512 distance matrix, 69 GFLOP, counted as a 0.06 ms copy, and every time against it a few percent).
Both are counted as the product that dominates them, 2 * batch * rows(x1) * rows(x2) * features, as FlopCounterMode
counts a matrix product.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode


def distance_flops(x1_shape: Sequence[int], x2_shape: Sequence[int], *args: Any,
                   out_shape: Sequence[int] | None = None, **kwargs: Any) -> int:
    batch = math.prod(out_shape[:-2]) if out_shape is not None else 1
    return 2 * batch * x1_shape[-2] * x2_shape[-2] * x1_shape[-1]


UNCOUNTED = {torch.ops.aten._euclidean_dist: distance_flops, torch.ops.aten._cdist_forward: distance_flops}


def flop_counter() -> FlopCounterMode:
    """FlopCounterMode(display=False) that counts the ops of UNCOUNTED too."""
    return FlopCounterMode(display=False, custom_mapping=UNCOUNTED)
