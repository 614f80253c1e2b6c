"""Softmax over the last dimension, one program per row.

A row that fits in one block (up to 16,384 elements) is read once and written once. Longer rows use the online
softmax: one pass keeps a running maximum and a rescaled running sum, a second pass writes the result, so the row
is read twice instead of the three times of max, sum and divide as separate passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ONE_BLOCK = 16384


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, N, stride_x, stride_y, BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    cols = tl.arange(0, BLOCK)
    if ONE_BLOCK:
        ok = cols < N
        x = tl.load(x_row + cols, mask=ok, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(y_row + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=ok)
    else:
        running_max = tl.full((BLOCK,), -float("inf"), dtype=tl.float32)
        running_sum = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, N, BLOCK):
            ok = start + cols < N
            x = tl.load(x_row + start + cols, mask=ok, other=-float("inf")).to(tl.float32)
            new_max = tl.maximum(running_max, x)
            # Lanes that have seen only -inf keep a zero sum, and -inf adds nothing (exp(-inf - -inf) is NaN).
            scale = tl.where(new_max == -float("inf"), 0.0, tl.exp(running_max - new_max))
            running_sum = running_sum * scale + tl.where(x == -float("inf"), 0.0, tl.exp(x - new_max))
            running_max = new_max
        row_max = tl.max(running_max, axis=0)
        lane_scale = tl.where(running_max == -float("inf"), 0.0, tl.exp(running_max - row_max))
        total = tl.sum(running_sum * lane_scale, axis=0)
        for start in range(0, N, BLOCK):
            ok = start + cols < N
            x = tl.load(x_row + start + cols, mask=ok, other=-float("inf")).to(tl.float32)
            tl.store(y_row + start + cols, (tl.exp(x - row_max) / total).to(y_ptr.dtype.element_ty), mask=ok)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax(x, dim=-1)."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty_like(x2)
    one_block = n <= MAX_ONE_BLOCK
    block = triton.next_power_of_2(n) if one_block else 4096
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    _softmax_kernel[(x2.shape[0],)](x2, y, n, x2.stride(0), y.stride(0), BLOCK=block, ONE_BLOCK=one_block,
                                    num_warps=warps)
    return y.reshape(x.shape)
