"""Convolutions (templates.conv): nn.Conv1d/2d/3d and nn.ConvTranspose1d/2d/3d, their bias the chain's first step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from farm_agent.tuner.templates.conv import ConvKernel, ConvSpec, kernel_operands, torch_conv
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, one_input

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


class ConvRegion(TemplateRegion):
    kind = "conv"

    def __init__(self, conv: nn.Module, chain: Sequence[Step], sources: Sequence[tuple[str, Any]],
                 precision: str) -> None:
        super().__init__(chain, sources, 1, 1)
        self.conv = conv
        self.spec = ConvSpec.of(conv)
        self.precision = precision
        self.kernel = ConvKernel(self.spec, self.chain, precision)
        self._packed: tuple[Any, torch.Tensor] | None = None

    def produce(self, x: torch.Tensor) -> torch.Tensor:
        return torch_conv(x, self.conv.weight, None, self.spec)

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        x = inputs[0]
        w = self.conv.weight
        key = (w.data_ptr(), w._version)
        if self._packed is None or self._packed[0] != key:  # the weight laid out once, again only if it changed
            self._packed = (key, self.kernel.pack(w.detach()))
        out_shape = self.spec.output_shape(x.shape, w.shape)
        return self.kernel(x, w.detach(), self._packed[1], kernel_operands(self.chain, operands, out_shape))

    def describe(self) -> str:
        s = self.spec
        name = f"{'convT' if s.transposed else 'conv'}{s.dims}d s{s.stride} p{s.padding} d{s.dilation} g{s.groups}"
        return f"{name} {self.precision} {super().describe()}"


def find(matcher: Matcher, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
    if not (isinstance(mod, nn.modules.conv._ConvNd) and one_input(node)):
        return None
    ConvSpec.of(mod)  # raises where the templates do not cover it
    conv, precision = mod, matcher.precision

    def make_conv(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return ConvRegion(conv, chain, sources, precision)

    anchor = Anchor("conv", [node.args[0]], 1, make_conv)  # type: ignore[list-item]
    if conv.bias is not None:
        anchor.chain.append(Step("add", "channel"))
        anchor.sources.append(("param", "conv.bias"))
    return anchor
