"""GEMM with a fused epilogue chain: y[b] = chain(a[b] @ bt[b]) for Linear, F.linear, matmul and bmm regions.

The operands are read through their strides (a Linear's weight is read as its transpose without a copy); the batch
runs on the grid's second axis (a broadcast operand has batch stride 0). Tiles are launched in groups of GROUP_M row
blocks that share the B columns while they are in L2. The epilogue (bias, scale, activation, residual, clamp ...)
runs on the accumulator before the single store: `chan` is the output column, `offs` the element's flat offset.

Pairwise Euclidean distances (torch.cdist, p = 2) are the same kernel with `distance` on: the product x @ y^T and,
before the epilogue, sqrt(max(|x_i|^2 + |y_j|^2 - 2 x_i.y_j, 0)) with the squared norms read per row and column
(computed beforehand, as PyTorch's own matrix form of cdist does): one pass where eager makes several.

precision: "ieee" (fp32 FMA), "tf32x3" (split-TF32, fp32-level error), "tf32" (lowers precision). The tensor-core
precisions read B K-major (k_major).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from farm_agent.tuner.templates import codegen
from farm_agent.tuner.templates.epilogue import Step, triton_lines

PRECISIONS = ("ieee", "tf32x3", "tf32")

_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def kernel(A, B, Y, {distance_params}{epi_params}M, N, K, s_ab, s_am, s_ak, s_bb, s_bk, s_bn,
           PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * blocks_n
    first_m = (pid // per_group) * GROUP_M
    group_size = min(blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = A + batch * s_ab + rm[:, None].to(tl.int64) * s_am + rk[None, :] * s_ak
    b_ptrs = B + batch * s_bb + rk[:, None] * s_bk + rn[None, :].to(tl.int64) * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision=PRECISION)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    chan = rn[None, :]
    offs = batch * M * N + rm[:, None].to(tl.int64) * N + rn[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
{distance}
{epilogue}
    tl.store(Y + offs, acc, mask=mask)
'''


_DISTANCE = """\
    xn = tl.load(XN + batch * M + rm, mask=rm < M, other=0.0)
    yn = tl.load(YN + batch * s_yn + rn, mask=rn < N, other=0.0)
    acc = tl.sqrt_rn(tl.maximum(xn[:, None] + yn[None, :] - 2.0 * acc, 0.0))"""


def configs(precision: str, m: int, n: int, k: int) -> list[Any]:
    """The autotuning space, pruned so that no tile is much wider than the matrix it covers (three tiles: each
    config is a compile of seconds)."""
    import triton

    if precision == "ieee":
        shapes = [(64, 64, 16, 4, 2), (128, 128, 16, 8, 2), (128, 64, 16, 8, 2)]
    else:
        shapes = [(128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 64, 32, 4, 4)]
    caps = (max(16, triton.next_power_of_2(m)), max(16, triton.next_power_of_2(n)), max(16, triton.next_power_of_2(k)))
    seen: set[tuple[int, ...]] = set()
    found = []
    for bm, bn, bk, warps, stages in shapes:
        key = (min(bm, caps[0]), min(bn, caps[1]), min(bk, caps[2]), warps, stages)
        if key not in seen:
            seen.add(key)
            found.append(triton.Config({"BLOCK_M": key[0], "BLOCK_N": key[1], "BLOCK_K": key[2], "GROUP_M": 8},
                                       num_warps=warps, num_stages=stages))
    return found


def batched_views(a: torch.Tensor, bt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """a [..., M, K] and bt [..., K, N] (broadcast batch dims) as 3-D views [B, M, K], [B or 1, K, N], and the
    output's shape. A 2-D `bt` is shared by every batch (stride 0)."""
    if a.dim() < 2 or bt.dim() < 2:
        raise ValueError("matrix operands need at least two dims")
    if a.shape[-1] != bt.shape[-2]:
        raise ValueError(f"inner dims differ: {a.shape[-1]} and {bt.shape[-2]}")
    batch = torch.broadcast_shapes(a.shape[:-2], bt.shape[:-2])
    out_shape = (*batch, a.shape[-2], bt.shape[-1])
    if bt.dim() == 2:  # a Linear: fold a's batch into its rows when they are contiguous
        a2 = a.reshape(-1, a.shape[-2], a.shape[-1]) if a.dim() > 2 else a.unsqueeze(0)
        if a2.shape[0] > 1 and a2.is_contiguous():
            a2 = a2.reshape(1, -1, a.shape[-1])
        return a2, bt.unsqueeze(0), out_shape
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = bt.expand(*batch, *bt.shape[-2:]).reshape(-1, *bt.shape[-2:])
    return a3, b3, out_shape


def k_major(b: torch.Tensor) -> torch.Tensor:
    """b [B, K, N] with K contiguous (a copy where N is): tensor-core products read a K-major B tile straight into
    shared memory (stmatrix), an N-major one through a transposing store (scalar st.shared, in the sm_90 code), the
    likely reason why on the H200 the split-TF32 GEMMs won on Linear layers (whose B, the weight read transposed, is
    K-major) and lost to cuBLAS on a @ b and bmm. The copy is one pass over B, which a GEMM of 256 rows or more reads
    many times."""
    if b.stride(-2) == 1 or b.shape[-2] == 1:
        return b
    if b.shape[0] > 1 and b.stride(0) == 0:  # one B shared by the batch: copied once
        return k_major(b[:1]).expand(b.shape)
    return b.transpose(-1, -2).contiguous().transpose(-1, -2)


class GemmKernel:
    def __init__(self, chain: tuple[Step, ...], precision: str, distance: bool = False) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        self.chain, self.precision, self.distance = chain, precision, distance
        self._kernel: Any = None

    def source(self) -> str:
        params, lines = triton_lines(self.chain)
        return _SOURCE.format(epi_params="".join(f"{p}, " for p in params), epilogue="\n".join(lines),
                              distance_params="XN, YN, s_yn, " if self.distance else "",
                              distance=_DISTANCE if self.distance else "")

    def __call__(self, a: torch.Tensor, bt: torch.Tensor, operands: Sequence[torch.Tensor]) -> torch.Tensor:
        """chain(a @ bt), or with `distance` chain(the distances between a's rows and bt's columns)."""
        a3, b3, out_shape = batched_views(a, bt)
        batches, m, k = a3.shape
        n = b3.shape[-1]
        if self.precision != "ieee" and m >= 256:
            b3 = k_major(b3)
        if self._kernel is None:
            module = codegen.load_source(self.source(), "distance" if self.distance else "gemm")
            self._kernel = codegen.autotuned(module.kernel, configs(self.precision, m, n, k), ["M", "N", "K"])
        y = torch.empty((batches, m, n), device=a.device, dtype=torch.float32)
        s_bb = b3.stride(0) if b3.shape[0] > 1 else 0
        norms: list[Any] = []
        if self.distance:  # squared norms of a's rows and bt's columns, in the views' batch layout
            yn = b3.square().sum(1).contiguous()
            norms = [a3.square().sum(2).contiguous(), yn, n if yn.shape[0] > 1 else 0]
        self._kernel[lambda meta: (-(-m // meta["BLOCK_M"]) * -(-n // meta["BLOCK_N"]), batches)](
            a3, b3, y, *norms, *operands, m, n, k, a3.stride(0), a3.stride(1), a3.stride(2), s_bb, b3.stride(1),
            b3.stride(2), PRECISION=self.precision)
        return y.reshape(out_shape)
