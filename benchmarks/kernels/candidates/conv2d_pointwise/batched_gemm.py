"""1x1 convolution as one batched GEMM: W (512x256) times each image's 256 x 3136 pixel matrix, with the bias added
in the GEMM's epilogue (baddbmm), straight on the NCHW layout with no copies."""

import torch


class ModelNew(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        weight = self.conv.weight.view(self.conv.out_channels, channels)
        pixels = x.reshape(batch, channels, height * width)
        out = torch.baddbmm(self.conv.bias.view(1, -1, 1), weight.expand(batch, -1, -1), pixels)
        return out.view(batch, self.conv.out_channels, height, width)
