"""Triton GroupNorm, one program per (image, group): a first pass over the group's contiguous 64K values sums x and
x^2 in fp32 lanes, a second pass (mostly from L2) normalises, applies the per-channel affine and writes once."""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a CPU box): the torch path below runs instead
    triton = None

BLOCK = 4096

if triton is not None:

    @triton.jit
    def _group_norm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, GROUP_SIZE, HW, CHANNELS_PER_GROUP, GROUPS, eps,
                           BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)  # image * GROUPS + group
        group = pid % GROUPS
        base = pid * GROUP_SIZE  # a group's channels are contiguous in NCHW
        offsets = tl.arange(0, BLOCK)
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        total_sq = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, GROUP_SIZE, BLOCK):
            ok = start + offsets < GROUP_SIZE
            x = tl.load(x_ptr + base + start + offsets, mask=ok, other=0.0).to(tl.float32)
            total += x
            total_sq += x * x
        mean = tl.sum(total, axis=0) / GROUP_SIZE
        variance = tl.maximum(tl.sum(total_sq, axis=0) / GROUP_SIZE - mean * mean, 0.0)
        inv = 1.0 / tl.sqrt(variance + eps)
        for start in range(0, GROUP_SIZE, BLOCK):
            idx = start + offsets
            ok = idx < GROUP_SIZE
            channel = group * CHANNELS_PER_GROUP + idx // HW
            x = tl.load(x_ptr + base + idx, mask=ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + channel, mask=ok, other=0.0)
            b = tl.load(b_ptr + channel, mask=ok, other=0.0)
            tl.store(y_ptr + base + idx, (x - mean) * inv * w + b, mask=ok)


class ModelNew(torch.nn.Module):
    def __init__(self, groups: int, channels: int) -> None:
        super().__init__()
        self.norm = torch.nn.GroupNorm(groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton is None or not x.is_cuda or x.dim() < 3:
            return self.norm(x)
        x = x.contiguous()
        batch, channels = x.shape[:2]
        groups = self.norm.num_groups
        hw = x[0, 0].numel()
        group_size = (channels // groups) * hw
        y = torch.empty_like(x)
        _group_norm_kernel[(batch * groups,)](x, y, self.norm.weight, self.norm.bias, group_size, hw,
                                              channels // groups, groups, self.norm.eps, BLOCK=BLOCK, num_warps=8)
        return y
