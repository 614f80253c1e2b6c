"""Triton elementwise chain in one pass: x read once, tanh/sigmoid/square/clamp done in registers, y written once
(eager runs about ten kernels, each a full read and write of the 1 GiB tensor)."""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a CPU box): the torch path below runs instead
    triton = None

BLOCK = 4096

if triton is not None:

    @triton.jit
    def _chain_kernel(x_ptr, y_ptr, numel, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offsets < numel
        x = tl.load(x_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
        t = x * 1.7 + 0.3
        t = 2.0 / (1.0 + tl.exp(-2.0 * t)) - 1.0  # tanh(t); exp overflow to inf gives -1, as tanh does
        y = t * (1.0 / (1.0 + tl.exp(-x))) - 0.25 * x * x
        y = tl.minimum(tl.maximum(y, -2.0), 2.0) + 0.1 * x
        tl.store(y_ptr + offsets, y, mask=ok)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton is None or not x.is_cuda:
            y = torch.tanh(x * 1.7 + 0.3)
            y = y * torch.sigmoid(x) - 0.25 * x * x
            return torch.clamp(y, min=-2.0, max=2.0) + 0.1 * x
        x = x.contiguous()
        y = torch.empty_like(x)
        numel = x.numel()
        _chain_kernel[(triton.cdiv(numel, BLOCK),)](x, y, numel, BLOCK=BLOCK, num_warps=8)
        return y
