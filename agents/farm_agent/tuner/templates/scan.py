"""Scans along the last dim (cumsum, cumprod) in one read and one write of each element, fp32 throughout.

The input is viewed as rows of its last dim. A program takes ROWS rows and walks them in chunks of BLOCK columns:
each chunk is scanned in registers (tl.cumsum / tl.cumprod), combined with the running carry of the chunks before
it (the last column of the previous result), and stored after the epilogue chain (`chan`: the column). A short row
is one chunk, several rows a program; a long one is one row a program and a loop, the next chunk's load issued
before the current chunk's scan so that a load is always in flight while the scan and the store run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from farm_agent.tuner.templates import codegen
from farm_agent.tuner.templates.epilogue import Step, triton_lines

OPS = ("cumsum", "cumprod")
MAX_ONE_CHUNK = 4096  # longer rows loop over chunks


@dataclass(frozen=True)
class ScanSpec:
    op: str

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown scan {self.op!r}")

    @staticmethod
    def rows(shape: Sequence[int]) -> tuple[int, int]:
        """(rows, row length) of an input shape: the last dim is the row."""
        if not shape:
            raise ValueError("a scan needs at least one dim")
        total = 1
        for s in shape:
            total *= s
        return total // max(shape[-1], 1), shape[-1]


def torch_scan(x: torch.Tensor, spec: ScanSpec) -> torch.Tensor:
    return torch.cumsum(x, dim=-1) if spec.op == "cumsum" else torch.cumprod(x, dim=-1)


_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def kernel(X, Y, {epi_params}R, L, OP: tl.constexpr, LOOP: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # OP: 0 cumsum, 1 cumprod. LOOP: rows longer than BLOCK, walked in chunks with a carry
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    r_ok = rows < R
    cols = tl.arange(0, BLOCK)
    base = rows.to(tl.int64)[:, None] * L
    # columns past the row's end are read as 0 (cumsum) or 1 (cumprod): they come after every valid one, and an
    # inclusive scan's value at a column depends only on the columns before it
    x = tl.load(X + base + cols[None, :], mask=r_ok[:, None] & (cols[None, :] < L), other=OP * 1.0).to(tl.float32)
    if LOOP:
        if OP == 0:
            carry = tl.zeros((ROWS,), dtype=tl.float32)
        else:
            carry = tl.full((ROWS,), 1.0, dtype=tl.float32)
        for start in range(0, L, BLOCK):
            offs = base + start + cols[None, :]
            mask = r_ok[:, None] & ((start + cols)[None, :] < L)
            # the next chunk is in flight while this one is scanned and stored
            following = r_ok[:, None] & ((start + BLOCK + cols)[None, :] < L)
            x_next = tl.load(X + offs + BLOCK, mask=following, other=OP * 1.0).to(tl.float32)
            if OP == 0:
                acc = tl.cumsum(x, axis=1) + carry[:, None]
            else:
                acc = tl.cumprod(x, axis=1) * carry[:, None]
            carry = tl.sum(tl.where(cols[None, :] == BLOCK - 1, acc, 0.0), axis=1)  # the chunk's last value
            chan = (start + cols)[None, :] + rows[:, None] * 0
{epilogue_loop}
            tl.store(Y + offs, acc, mask=mask)
            x = x_next
    else:
        offs = base + cols[None, :]
        mask = r_ok[:, None] & (cols[None, :] < L)
        if OP == 0:
            acc = tl.cumsum(x, axis=1)
        else:
            acc = tl.cumprod(x, axis=1)
        chan = cols[None, :] + rows[:, None] * 0
{epilogue_one}
        tl.store(Y + offs, acc, mask=mask)
'''

OP_CODE = {op: i for i, op in enumerate(OPS)}


def plan(length: int) -> list[tuple[int, int, int]]:
    """(ROWS, BLOCK, num_warps) choices: the autotuning space. A row of up to MAX_ONE_CHUNK columns is one chunk,
    rows packed so that a program moves 8-32 KiB; a longer row loops over chunks of 2048 or 4096 columns (two rows a
    program for one choice). The register file holds a chunk and the next one: about 70-90 registers a thread, so
    that several programs share an SM and their loads overlap one another's scans."""
    if length > MAX_ONE_CHUNK:
        return [(1, 4096, 8), (1, 2048, 4), (2, 2048, 8)]
    block = 1 << max(0, length - 1).bit_length()
    choices: list[tuple[int, int, int]] = []
    for tile in (2048, 4096, 8192):
        rows = max(1, tile // block)
        choice = (rows, block, 4 if rows * block <= 2048 else 8)
        if choice not in choices:
            choices.append(choice)
    return choices


class ScanKernel:
    def __init__(self, spec: ScanSpec, chain: tuple[Step, ...]) -> None:
        self.spec, self.chain = spec, chain
        self._kernel: Any = None
        self._length = -1

    def source(self) -> str:
        params, _ = triton_lines(self.chain)
        return _SOURCE.format(epi_params="".join(f"{p}, " for p in params),
                              epilogue_loop="\n".join(triton_lines(self.chain, " " * 12)[1]),
                              epilogue_one="\n".join(triton_lines(self.chain, " " * 8)[1]))

    def _compiled(self, length: int) -> Any:
        import triton

        if self._kernel is None or plan(length) != plan(self._length):
            module = codegen.load_source(self.source(), "scan")
            configs = [triton.Config({"ROWS": r, "BLOCK": b}, num_warps=w) for r, b, w in plan(length)]
            self._kernel, self._length = codegen.autotuned(module.kernel, configs, ["R", "L"]), length
        return self._kernel

    def __call__(self, x: torch.Tensor, operands: Sequence[torch.Tensor]) -> torch.Tensor:
        import triton

        x = x.contiguous()
        r, length = self.spec.rows(x.shape)
        y = torch.empty(x.shape, device=x.device, dtype=torch.float32)
        if y.numel() == 0:
            return y
        self._compiled(length)[lambda meta: (triton.cdiv(r, meta["ROWS"]),)](
            x, y, *operands, r, length, OP=OP_CODE[self.spec.op], LOOP=length > MAX_ONE_CHUNK)
        return y
