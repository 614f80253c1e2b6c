"""Triton var_mean over rows: the 16,384-wide row read once into registers, mean and the centred (unbiased) variance
both computed there, two outputs from one read of the input."""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a CPU box): the torch path below runs instead
    triton = None

if triton is not None:

    @triton.jit
    def _var_mean_kernel(x_ptr, var_ptr, mean_ptr, N, stride_x, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / N
        centred = tl.where(ok, x - mean, 0.0)
        tl.store(var_ptr + row, tl.sum(centred * centred, axis=0) / (N - 1))  # correction=1, as torch.var_mean
        tl.store(mean_ptr + row, mean)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if triton is None or not x.is_cuda or x.dim() != 2 or x.shape[1] > 16384 or x.shape[1] < 2:
            mean = x.mean(dim=1)
            variance = (x - mean[:, None]).pow(2).sum(dim=1) / (x.shape[1] - 1)
            return variance, mean
        if x.stride(1) != 1:
            x = x.contiguous()
        rows, n = x.shape
        variance = torch.empty(rows, device=x.device, dtype=x.dtype)
        mean = torch.empty(rows, device=x.device, dtype=x.dtype)
        block = triton.next_power_of_2(n)
        _var_mean_kernel[(rows,)](x, variance, mean, n, x.stride(0), BLOCK=block,
                                  num_warps=16 if block >= 8192 else 8)
        return variance, mean
