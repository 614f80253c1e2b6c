"""Triton F.normalize over rows: each 8192-wide row read once into registers, its norm taken and the row scaled and
written once (eager takes the norm, clamps, expands and divides in separate passes over memory)."""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a CPU box): the torch path below runs instead
    triton = None

EPS = 1e-12  # F.normalize's default

if triton is not None:

    @triton.jit
    def _l2_normalize_kernel(x_ptr, y_ptr, N, stride_x, stride_y, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        norm = tl.sqrt(tl.sum(x * x, axis=0))
        y = x / tl.maximum(norm, eps)
        tl.store(y_ptr + row * stride_y + cols, y, mask=ok)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton is None or not x.is_cuda or x.dim() != 2 or x.shape[1] > 16384:
            return x / x.norm(p=2, dim=1, keepdim=True).clamp_min(EPS)
        if x.stride(1) != 1:
            x = x.contiguous()
        rows, n = x.shape
        y = torch.empty_like(x)
        block = triton.next_power_of_2(n)
        _l2_normalize_kernel[(rows,)](x, y, n, x.stride(0), y.stride(0), EPS, BLOCK=block,
                                      num_warps=16 if block >= 8192 else 8)
        return y
