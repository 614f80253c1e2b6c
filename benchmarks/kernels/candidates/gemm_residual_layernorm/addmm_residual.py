"""x + s * (x W^T + b) as one addmm with alpha = s and the pre-scaled bias s*b in its epilogue, then the residual
added in place: the separate scale pass and the out-of-place add of eager are gone before the LayerNorm."""

import torch
import torch.nn.functional as F


class ModelNew(torch.nn.Module):
    def __init__(self, features: int, residual_scale: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(features, features)
        self.norm = torch.nn.LayerNorm(features)
        self.residual_scale = residual_scale
        with torch.no_grad():
            self.register_buffer("scaled_bias", self.linear.bias * residual_scale, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.addmm(self.scaled_bias, x2, self.linear.weight.t(), alpha=self.residual_scale).add_(x2)
        return F.layer_norm(y, self.norm.normalized_shape, self.norm.weight, self.norm.bias, self.norm.eps).view(x.shape)
