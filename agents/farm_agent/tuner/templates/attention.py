"""Scaled dot-product attention, forward: y = chain(softmax(q @ k^T * scale [causal]) @ v) in one pass over k and v.

The online-softmax (flash-attention) form: one program per BLOCK_M query rows of one (batch, head); it walks the
keys in blocks of BLOCK_N, keeping each row's running max and sum of exponentials and an fp32 accumulator of
p @ v rescaled as the max grows, and divides by the sum at the end. The scores never reach memory: q, k and v are
read once a program and y is written once, through the epilogue chain (`chan`: the value head dim).

`is_causal` (PyTorch's top-left aligned mask: query i sees keys j <= i) skips the key blocks past a program's last
row and masks the block on the diagonal.

precision: "ieee" (fp32 FMA), "tf32x3" (split-TF32, fp32-level error), "tf32" (lowers precision), as for the GEMM.
Both products read their B operand K-major for the tensor-core precisions (gemm.k_major says why): k^T is (k is
[S, D] with D contiguous); v [S, DV] is not, so those precisions read a transposed copy [DV, S] (one pass over v).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from farm_agent.tuner.templates import codegen
from farm_agent.tuner.templates.epilogue import Step, triton_lines

PRECISIONS = ("ieee", "tf32x3", "tf32")
HEAD_DIMS = (16, 32, 64, 128)
SHARED_BYTES = 200 * 1024  # of the H100/H200's 228 KB per SM, with room for Triton's own scratch

_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def kernel(Q, K, V, Y, {epi_params}LQ, LK, qk_scale, PRECISION: tl.constexpr, CAUSAL: tl.constexpr,
           V_K_MAJOR: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # V_K_MAJOR: v is laid out [heads, DV, LK] (the second product's B K-major), else [heads, LK, DV]
    pid_m = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, D)
    rdv = tl.arange(0, DV)
    q = tl.load(Q + head * LQ * D + rm[:, None].to(tl.int64) * D + rd[None, :], mask=rm[:, None] < LQ, other=0.0)
    k_base = K + head * LK * D
    v_base = V + head * LK * DV
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, DV), dtype=tl.float32)
    end = LK
    if CAUSAL:  # the key blocks past this program's last row see none of its rows
        end = tl.minimum(LK, (pid_m + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        cols = start + rn
        kt = tl.load(k_base + cols[None, :].to(tl.int64) * D + rd[:, None], mask=cols[None, :] < LK, other=0.0)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # log2 units: scale * log2(e)
        valid = cols[None, :] < LK
        if CAUSAL:
            valid = valid & (cols[None, :] <= rm[:, None])
        # every row has a valid key in the first block (key 0), so m_new is finite from then on
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if V_K_MAJOR:
            v_ptrs = v_base + cols[:, None] + rdv[None, :].to(tl.int64) * LK
        else:
            v_ptrs = v_base + cols[:, None].to(tl.int64) * DV + rdv[None, :]
        v = tl.load(v_ptrs, mask=cols[:, None] < LK, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    chan = rdv[None, :]
    offs = head * LQ * DV + rm[:, None].to(tl.int64) * DV + rdv[None, :]
    mask = (rm[:, None] < LQ) & (rdv[None, :] < DV)
{epilogue}
    tl.store(Y + offs, acc, mask=mask)
'''


def shared_bytes(block_m: int, block_n: int, stages: int, d: int, dv: int) -> int:
    """A tile's shared memory, roughly: q, `stages` buffers of the k and v blocks, and p for the second product."""
    return 4 * (block_m * d + stages * block_n * (d + dv) + block_m * block_n)


def tiles(precision: str, d: int, dv: int, lk: int) -> list[tuple[int, int, int, int]]:
    """Three tiles (BLOCK_M, BLOCK_N, warps, stages; each config a compile of seconds) that fit in shared memory for
    these head dims, no key block much wider than the keys."""
    if precision == "ieee":
        shapes = [(64, 32, 4, 2), (64, 64, 8, 2), (32, 64, 4, 2)]
    else:
        shapes = [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 2), (32, 32, 4, 2)]
    cap_n = max(16, 1 << (lk - 1).bit_length())
    found: list[tuple[int, int, int, int]] = []
    for bm, bn, warps, stages in shapes:
        tile = (bm, min(bn, cap_n), warps, stages)
        if tile not in found and shared_bytes(bm, tile[1], stages, d, dv) <= SHARED_BYTES:
            found.append(tile)
    return found[:3]


def configs(precision: str, d: int, dv: int, lk: int) -> list[Any]:
    import triton

    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)
            for bm, bn, warps, stages in tiles(precision, d, dv, lk)]


def head_dims_covered(d: int, dv: int) -> bool:
    return d in HEAD_DIMS and dv in HEAD_DIMS


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None
                    ) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


class AttentionKernel:
    def __init__(self, chain: tuple[Step, ...], precision: str, causal: bool, scale: float | None) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        self.chain, self.precision, self.causal, self.scale = chain, precision, causal, scale
        self._kernels: dict[tuple[int, int], Any] = {}  # per (head dim, value head dim): its tiles' shared memory

    def source(self) -> str:
        params, lines = triton_lines(self.chain)
        return _SOURCE.format(epi_params="".join(f"{p}, " for p in params), epilogue="\n".join(lines))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, operands: Sequence[torch.Tensor]
                 ) -> torch.Tensor:
        """chain(attention(q, k, v)) for q [..., Lq, D], k [..., Lk, D], v [..., Lk, DV] (leading dims broadcast)."""
        if q.dim() < 2 or k.dim() < 2 or v.dim() < 2 or k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2]:
            raise ValueError("q, k, v must be [..., Lq, D], [..., Lk, D], [..., Lk, DV]")
        (lq, d), (lk, dv) = q.shape[-2:], v.shape[-2:]
        if not head_dims_covered(d, dv) or lq == 0 or lk == 0:
            raise ValueError(f"head dims {d}, {dv} and lengths {lq}, {lk} are not covered")
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        q3, k3, v3 = (t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:]).contiguous() for t in (q, k, v))
        heads = q3.shape[0]
        v_k_major = self.precision != "ieee"
        if v_k_major:
            v3 = v3.transpose(1, 2).contiguous()  # [heads, DV, Lk]: the second product's B K-major
        if (d, dv) not in self._kernels:
            module = codegen.load_source(self.source(), "attention")
            self._kernels[(d, dv)] = codegen.autotuned(module.kernel, configs(self.precision, d, dv, lk), ["LQ", "LK"])
        scale = self.scale if self.scale is not None else d ** -0.5
        y = torch.empty((heads, lq, dv), device=q.device, dtype=torch.float32)
        self._kernels[(d, dv)][lambda meta: (-(-lq // meta["BLOCK_M"]), heads)](
            q3, k3, v3, y, *operands, lq, lk, scale * 1.4426950408889634, PRECISION=self.precision,
            CAUSAL=self.causal, V_K_MAJOR=v_k_major, D=d, DV=dv)
        return y.reshape(*batch, lq, dv)
