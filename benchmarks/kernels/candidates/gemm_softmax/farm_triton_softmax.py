"""cuBLAS GEMM for the head, then Farm's Triton softmax: each 16,384-wide logit row read once into registers and
written once."""

import torch


class ModelNew(torch.nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.head = torch.nn.Linear(features, classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(x)
        if not x.is_cuda:
            return torch.softmax(logits, dim=-1)
        from farm_agent.tuner.triton_kernels.softmax import softmax

        return softmax(logits)
