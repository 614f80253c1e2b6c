"""Inference BatchNorm as one Triton pass y = x * scale[c] + shift[c], scale and shift per channel computed once at
build time from the running statistics; each program scales a block of one (image, channel) plane with two scalars."""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a CPU box): the torch path below runs instead
    triton = None

BLOCK = 4096

if triton is not None:

    @triton.jit
    def _scale_shift_kernel(x_ptr, y_ptr, scale_ptr, shift_ptr, C, HW, BLOCK: tl.constexpr):
        plane = tl.program_id(0).to(tl.int64)  # one (image, channel) plane of HW values
        channel = plane % C
        offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offsets < HW
        scale = tl.load(scale_ptr + channel)
        shift = tl.load(shift_ptr + channel)
        x = tl.load(x_ptr + plane * HW + offsets, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + plane * HW + offsets, x * scale + shift, mask=ok)


class ModelNew(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm2d(channels)
        with torch.no_grad():  # the same draws as Model, in the same order
            self.norm.running_mean.uniform_(-1.0, 1.0)
            self.norm.running_var.uniform_(0.5, 2.0)
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)
            scale = self.norm.weight / torch.sqrt(self.norm.running_var + self.norm.eps)
            self.register_buffer("scale", scale.clone(), persistent=False)
            self.register_buffer("shift", self.norm.bias - self.norm.running_mean * scale, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton is None or not x.is_cuda or x.dim() != 4:
            return torch.addcmul(self.shift.view(1, -1, 1, 1), x, self.scale.view(1, -1, 1, 1))
        x = x.contiguous()
        batch, channels, height, width = x.shape
        hw = height * width
        y = torch.empty_like(x)
        _scale_shift_kernel[(batch * channels, triton.cdiv(hw, BLOCK))](x, y, self.scale, self.shift, channels, hw,
                                                                       BLOCK=BLOCK, num_warps=8)
        return y
