"""Triton a * silu(b) in one elementwise pass: reads a and b once and writes once (eager writes silu(b) to memory and
reads it back for the product)."""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a CPU box): the torch path below runs instead
    triton = None

BLOCK = 4096

if triton is not None:

    @triton.jit
    def _silu_gate_kernel(a_ptr, b_ptr, y_ptr, numel, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offsets < numel
        a = tl.load(a_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + offsets, a * (b / (1.0 + tl.exp(-b))), mask=ok)


class ModelNew(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if triton is None or not a.is_cuda or a.shape != b.shape:
            return a * torch.nn.functional.silu(b)
        a, b = a.contiguous(), b.contiguous()
        y = torch.empty_like(a)
        numel = a.numel()
        _silu_gate_kernel[(triton.cdiv(numel, BLOCK),)](a, b, y, numel, BLOCK=BLOCK, num_warps=8)
        return y
