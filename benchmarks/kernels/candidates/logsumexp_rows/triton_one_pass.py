"""Triton logsumexp over rows: the 16,384-wide row read once into registers, max, exp-sum and log done there (eager
logsumexp makes separate passes for the max, the shifted exponentials and their sum)."""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a CPU box): the torch path below runs instead
    triton = None

if triton is not None:

    @triton.jit
    def _logsumexp_kernel(x_ptr, y_ptr, N, stride_x, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
        row_max = tl.max(x, axis=0)
        total = tl.sum(tl.exp(x - row_max), axis=0)  # masked lanes: exp(-inf) = 0
        tl.store(y_ptr + row, row_max + tl.log(total))


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton is None or not x.is_cuda or x.dim() != 2 or x.shape[1] > 16384:
            row_max = x.amax(dim=-1, keepdim=True)
            return (x - row_max).exp().sum(dim=-1).log() + row_max.squeeze(-1)
        if x.stride(1) != 1:
            x = x.contiguous()
        rows, n = x.shape
        y = torch.empty(rows, device=x.device, dtype=x.dtype)
        block = triton.next_power_of_2(n)
        _logsumexp_kernel[(rows,)](x, y, n, x.stride(0), BLOCK=block, num_warps=16 if block >= 8192 else 8)
        return y
