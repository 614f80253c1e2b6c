"""The residual CNN with every inference BatchNorm folded into its conv's weights and a bias at build time, and ReLU
and the residual add done in place: each conv's output is read once by the next step instead of by a BN pass too."""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):  # Model's Block, built the same way so that the weights drawn are the same
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)


def fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv weight and bias that equal conv followed by inference-mode bn."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    return (conv.weight * scale[:, None, None, None]).contiguous(), bn.bias - bn.running_mean * scale


class ModelNew(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 5, stride=2, padding=2, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.stage1 = nn.Sequential(Block(64), Block(64))
        self.down = nn.Sequential(
            nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(128), nn.ReLU()
        )
        self.stage2 = nn.Sequential(Block(128), Block(128))
        self.head = nn.Linear(128, classes)
        with torch.no_grad():
            self.folded = nn.ParameterList()  # stem, stage1 (4 convs), down, stage2 (4 convs): weight, bias each
            pairs = [(self.stem[0], self.stem[1])]
            pairs += [(c, b) for blk in self.stage1 for c, b in ((blk.conv1, blk.bn1), (blk.conv2, blk.bn2))]
            pairs += [(self.down[0], self.down[1])]
            pairs += [(c, b) for blk in self.stage2 for c, b in ((blk.conv1, blk.bn1), (blk.conv2, blk.bn2))]
            for conv, bn in pairs:
                weight, bias = fold(conv, bn)
                self.folded.append(nn.Parameter(weight, requires_grad=False))
                self.folded.append(nn.Parameter(bias, requires_grad=False))

    def _conv(self, x: torch.Tensor, i: int, stride: int, padding: int) -> torch.Tensor:
        return F.conv2d(x, self.folded[2 * i], self.folded[2 * i + 1], stride=stride, padding=padding)

    def _stage(self, x: torch.Tensor, first: int) -> torch.Tensor:
        for i in (first, first + 2):  # two residual blocks of two convs each
            y = self._conv(x, i, 1, 1).relu_()
            x = self._conv(y, i + 1, 1, 1).add_(x).relu_()
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._conv(x, 0, 2, 2).relu_()
        x = self._stage(x, 1)
        x = self._conv(x, 5, 2, 1).relu_()
        x = self._stage(x, 6)
        return self.head(x.mean(dim=(2, 3)))
