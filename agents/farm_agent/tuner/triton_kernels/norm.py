"""LayerNorm and RMSNorm over the last dimension, one program per row.

When the row fits in one block (up to 16,384 elements) it is read once, kept in registers for the statistics and
the normalisation, and written once: the least traffic a norm can have. Longer rows take three passes (mean,
variance, normalise), still one launch. Statistics are in fp32 whatever the input's type.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ONE_BLOCK = 16384


@triton.jit
def _norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, stride_x, stride_y, eps,
                 RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr,
                 ONE_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    cols = tl.arange(0, BLOCK)
    if ONE_BLOCK:
        ok = cols < N
        x = tl.load(x_row + cols, mask=ok, other=0.0).to(tl.float32)
        if RMS:
            inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
            y = x * inv
        else:
            mean = tl.sum(x, axis=0) / N
            centred = tl.where(ok, x - mean, 0.0)
            inv = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / N + eps)
            y = centred * inv
        if HAS_W:
            y = y * tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        mean = 0.0
        if not RMS:
            acc = tl.zeros((BLOCK,), dtype=tl.float32)
            for start in range(0, N, BLOCK):
                ok = start + cols < N
                acc += tl.load(x_row + start + cols, mask=ok, other=0.0).to(tl.float32)
            mean = tl.sum(acc, axis=0) / N
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, N, BLOCK):
            ok = start + cols < N
            x = tl.load(x_row + start + cols, mask=ok, other=0.0).to(tl.float32)
            d = tl.where(ok, x - mean, 0.0)
            acc += d * d
        inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
        for start in range(0, N, BLOCK):
            ok = start + cols < N
            x = tl.load(x_row + start + cols, mask=ok, other=0.0).to(tl.float32)
            y = (x - mean) * inv
            if HAS_W:
                y = y * tl.load(w_ptr + start + cols, mask=ok, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(b_ptr + start + cols, mask=ok, other=0.0).to(tl.float32)
            tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=ok)


def norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float, rms: bool
         ) -> torch.Tensor:
    """LayerNorm (rms=False) or RMSNorm (rms=True) of x over its last dimension."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty_like(x2)
    one_block = n <= MAX_ONE_BLOCK
    block = triton.next_power_of_2(n) if one_block else 4096
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    _norm_kernel[(x2.shape[0],)](
        x2, weight if weight is not None else x2, bias if bias is not None else x2, y, n, x2.stride(0), y.stride(0),
        eps, RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None, BLOCK=block, ONE_BLOCK=one_block,
        num_warps=warps,
    )
    return y.reshape(x.shape)
