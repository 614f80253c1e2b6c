"""Embedding lookups (nn.Embedding, F.embedding, torch.embedding): rows of a [V, D] fp32 table gathered by ids of
any shape (int32 or int64) into [*ids.shape, D], with the elementwise chain fused before the single store.

A program copies ROWS looked-up rows as a [ROWS, BLOCK_D] tile: its ids loaded once as a vector, each row's offset
in int64 (a table of V * D > 2^31 elements is ordinary), D walked in chunks of BLOCK_D columns when it is longer than
one (`chan`: the column, the chain's channel). Nothing is computed, so the kernel is bound by memory: each looked-up
row read once and each output row written once. The output is stored with eviction_policy="evict_first": nothing
in the kernel reads it again, and it should not push out of L2 the table rows that repeated ids would hit there
(the table's loads keep the default policy, as a small table is read many times from L2).

Ids out of range: PyTorch raises (on a GPU through a device-side assert, which ends the process's CUDA context).
The kernel never reads outside the table (an id out of range loads nothing, its row is zeros before the chain) and
reports it the way PyTorch's CUDA kernel does, with a device assert in the kernel (compiled in by launching with
debug=True; sanitize_overflow=False keeps Triton's debug mode from adding overflow checks to every integer op):
one comparison per row, no extra kernel and no device-to-host synchronisation, which a host-side range check would
need on every call. Triton's CPU interpreter compiles no asserts, so there (CPU tensors) the range is checked on
the host, where it costs nothing to synchronise, with PyTorch's own error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from farm_agent.tuner.templates import codegen
from farm_agent.tuner.templates.epilogue import Step, triton_lines

MAX_BLOCK_D = 1024  # longer rows are walked in chunks of this many columns
ID_DTYPES = (torch.int32, torch.int64)  # what F.embedding accepts as ids
# (elements a tile, warps): 16 to 32 elements a thread, 4-8 16-byte loads in flight, tiles of 4 to 32 KiB
TILES = ((1024, 2), (2048, 4), (4096, 4), (8192, 8))

_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def kernel(IDS, W, Y, {epi_params}N, V, D, s_w, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # the lookups of this program
    r_ok = rows < N
    ids = tl.load(IDS + rows, mask=r_ok, other=0).to(tl.int64)
    in_range = (ids >= 0) & (ids < V)
    tl.device_assert(in_range | ~r_ok, "embedding: an id is out of the table's range")
    take = (r_ok & in_range)[:, None]  # an id out of range reads nothing
    src = ids[:, None] * s_w
    dst = rows[:, None] * D
    cols = tl.arange(0, BLOCK_D)
    for start in range(0, D, BLOCK_D):
        c = start + cols
        c_ok = (c < D)[None, :]
        acc = tl.load(W + src + c[None, :], mask=take & c_ok, other=0.0).to(tl.float32)
        offs = dst + c[None, :]
        mask = r_ok[:, None] & c_ok
        chan = tl.broadcast_to(c[None, :], (ROWS, BLOCK_D))
{epilogue}
        tl.store(Y + offs, acc, mask=mask, eviction_policy="evict_first")
'''


def plan(dim: int) -> list[tuple[int, int, int]]:
    """(ROWS, BLOCK_D, num_warps) choices, the autotuning space: BLOCK_D the row's length rounded up to a power of
    two (at most MAX_BLOCK_D: longer rows loop), ROWS so that a tile holds TILES' elements."""
    block = min(1 << max(0, dim - 1).bit_length(), MAX_BLOCK_D)
    choices: list[tuple[int, int, int]] = []
    for elements, warps in TILES:
        choice = (max(1, elements // block), block, warps)
        if choice not in choices:
            choices.append(choice)
    return choices


class GatherKernel:
    def __init__(self, chain: tuple[Step, ...]) -> None:
        self.chain = chain
        self._kernel: Any = None
        self._dim = -1

    def source(self) -> str:
        params, lines = triton_lines(self.chain, " " * 8)
        return _SOURCE.format(epi_params="".join(f"{p}, " for p in params), epilogue="\n".join(lines))

    def _compiled(self, dim: int) -> Any:
        import triton

        if self._kernel is None or plan(dim) != plan(self._dim):
            module = codegen.load_source(self.source(), "gather")
            configs = [triton.Config({"ROWS": r, "BLOCK_D": b}, num_warps=w) for r, b, w in plan(dim)]
            self._kernel, self._dim = codegen.autotuned(module.kernel, configs, ["N", "D"]), dim
        return self._kernel

    def __call__(self, weight: torch.Tensor, ids: torch.Tensor, operands: Sequence[torch.Tensor]) -> torch.Tensor:
        """weight [V, D] fp32, ids int32/int64 of any shape; operands: the chain's, as kernel_operands lays them out
        for the output [*ids.shape, D]."""
        if ids.dtype not in ID_DTYPES:
            raise TypeError(f"embedding ids must be int32 or int64, not {ids.dtype}")
        if not ids.is_cuda and ids.numel() and not bool(((ids >= 0) & (ids < weight.shape[0])).all()):
            raise IndexError("index out of range in self")  # PyTorch's words; on a GPU, the kernel's assert
        return self.launch(weight, ids, operands)

    def launch(self, weight: torch.Tensor, ids: torch.Tensor, operands: Sequence[torch.Tensor]) -> torch.Tensor:
        """The kernel alone (no host-side check): an id out of range gives a row of zeros before the chain."""
        import triton

        if weight.dim() != 2:
            raise ValueError("an embedding table is [V, D]")
        if weight.stride(1) != 1:
            weight = weight.contiguous()
        flat = ids.reshape(-1)
        n, dim = flat.numel(), weight.shape[1]
        y = torch.empty((*ids.shape, dim), device=weight.device, dtype=torch.float32)
        if y.numel() == 0:
            return y
        self._compiled(dim)[lambda meta: (triton.cdiv(n, meta["ROWS"]),)](
            flat, weight, y, *operands, n, weight.shape[0], dim, weight.stride(0), debug=True,
            sanitize_overflow=False)
        return y
