"""A GEMM with its epilogue fused: y = act(x @ W.T + b) in one kernel.

Eager PyTorch runs a Linear followed by an activation as two kernels (cuBLAS addmm, then the activation over the
whole output); Inductor's default also leaves the GEMM to cuBLAS and fuses only bias and activation into a second
pass. Here the bias and activation are applied to the accumulator tile while it is still in registers, so the output
is written once and never read back. `precision` picks the dot's arithmetic: "ieee" (full fp32, fp32-strict),
"tf32" (the tensor cores' fp32 mode, ~3e-4 relative error) or "fp16" (operands rounded to half, fp32 accumulate).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4, "sigmoid": 5, "tanh": 6}


def _configs() -> list[triton.Config]:
    if os.environ.get("TRITON_INTERPRET") == "1":  # the CPU interpreter cannot time configs: one, small
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4})]
    shapes = [(128, 128, 32, 4, 8), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4),
              (128, 256, 64, 3, 8), (32, 64, 32, 4, 4)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w)
            for m, n, k, s, w in shapes]


@triton.jit
def _activation(y, ACT: tl.constexpr):
    if ACT == 1:
        y = tl.maximum(y, 0.0)
    elif ACT == 2:
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == 3:
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = 0.5 * y * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0))
    elif ACT == 4:
        y = y / (1.0 + tl.exp(-y))
    elif ACT == 5:
        y = 1.0 / (1.0 + tl.exp(-y))
    elif ACT == 6:
        y = 2.0 / (1.0 + tl.exp(-2.0 * y)) - 1.0
    return y


@triton.autotune(configs=_configs(), key=["M", "N", "K", "PRECISION"])
@triton.jit
def _linear_act_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # Grouped launch order: GROUP_M row blocks share the column blocks of W while they are in L2.
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * blocks_n
    group = pid // per_group
    first_m = group * GROUP_M
    group_size = min(blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    x_tile = x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk
    w_tile = w_ptr + rk[:, None] * stride_wk + rn[None, :] * stride_wn  # W.T's tile: K rows, N columns
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        a = tl.load(x_tile, mask=(rm[:, None] < M) & k_ok[None, :], other=0.0)
        b = tl.load(w_tile, mask=k_ok[:, None] & (rn[None, :] < N), other=0.0)
        if PRECISION == "fp16":
            acc = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)
        elif PRECISION == "tf32":
            acc = tl.dot(a, b, acc, input_precision="tf32")
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        x_tile += BLOCK_K * stride_xk
        w_tile += BLOCK_K * stride_wk
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    acc = _activation(acc, ACT)
    y_tile = y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn
    tl.store(y_tile, acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def linear_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
               precision: str) -> torch.Tensor:
    """act(x @ weight.T + bias) over x's last dimension, like F.linear followed by the activation."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    n = weight.shape[0]
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    _linear_act_kernel[grid](
        x2, weight, bias if bias is not None else weight, y, m, n, k,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
        HAS_BIAS=bias is not None, ACT=ACTIVATIONS[activation], PRECISION=precision,
    )
    return y.reshape(*lead, n)
