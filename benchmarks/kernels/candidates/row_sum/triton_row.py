"""Triton row sum: one program per row, the whole 12,288-wide row in one masked block, read once with fp32 accumulation."""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a CPU box): the torch path below runs instead
    triton = None

if triton is not None:

    @triton.jit
    def _row_sum_kernel(x_ptr, y_ptr, N, stride_x, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + row, tl.sum(x, axis=0))


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton is None or not x.is_cuda or x.dim() != 2:
            return x.sum(dim=1)
        if x.stride(1) != 1:
            x = x.contiguous()
        rows, n = x.shape
        y = torch.empty(rows, device=x.device, dtype=x.dtype)
        block = triton.next_power_of_2(n)
        _row_sum_kernel[(rows,)](x, y, n, x.stride(0), BLOCK=block, num_warps=16 if block >= 8192 else 8)
        return y
