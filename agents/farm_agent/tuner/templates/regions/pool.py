"""Pooling (templates.pool): Max/AvgPool 1-D to 3-D, as modules or functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from farm_agent.tuner.templates.conv import kernel_operands
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.pool import PoolKernel, PoolSpec, torch_pool
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


class PoolRegion(TemplateRegion):
    kind = "pool"

    def __init__(self, spec: PoolSpec, chain: Sequence[Step], sources: Sequence[tuple[str, Any]]) -> None:
        super().__init__(chain, sources, 1, -(spec.dims + 1))
        self.spec = spec
        self.kernel = PoolKernel(spec, self.chain)

    def produce(self, x: torch.Tensor) -> torch.Tensor:
        return torch_pool(x, self.spec)

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        x = inputs[0]
        return self.kernel(x, kernel_operands(self.chain, operands, self.spec.output_shape(x.shape)))

    def describe(self) -> str:
        s = self.spec
        return f"{s.kind}pool{s.dims}d k{s.kernel} s{s.stride} {super().describe()}"


def find(matcher: Matcher, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
    spec = _spec(node, mod)
    if spec is None:
        return None

    def make_pool(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return PoolRegion(spec, chain, sources)

    return Anchor("pool", [node.args[0]], -(spec.dims + 1), make_pool)  # type: ignore[list-item]


def _spec(node: fx.Node, mod: nn.Module | None) -> PoolSpec | None:
    pool_types = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)
    if isinstance(mod, pool_types) and len(node.args) == 1 and not node.kwargs:
        return PoolSpec.of(mod)
    functions = {F.max_pool1d: nn.MaxPool1d, F.max_pool2d: nn.MaxPool2d, F.max_pool3d: nn.MaxPool3d,
                 F.avg_pool1d: nn.AvgPool1d, F.avg_pool2d: nn.AvgPool2d, F.avg_pool3d: nn.AvgPool3d}
    if node.op == "call_function" and node.target in functions and isinstance(node.args[0], fx.Node):
        if any(isinstance(a, fx.Node) for a in [*node.args[1:], *node.kwargs.values()]):
            return None
        return PoolSpec.of(functions[node.target](*node.args[1:], **node.kwargs))  # type: ignore[index]
    return None
