"""GEMMs (templates.gemm): nn.Linear (its bias the chain's first step), torch.matmul, @, bmm and mm, as functions or
methods. A bare fp32 GEMM is left to cuBLAS under `ieee` (Anchor.worth)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from farm_agent.tuner.templates.conv import kernel_operands
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.gemm import GemmKernel
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, one_input, shape_of

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


class GemmRegion(TemplateRegion):
    """a @ bt, where bt is either the second input (matmul, bmm) or a held Linear's weight read as its transpose."""

    kind = "gemm"

    def __init__(self, linear: nn.Module | None, chain: Sequence[Step], sources: Sequence[tuple[str, Any]],
                 precision: str) -> None:
        super().__init__(chain, sources, 1 if linear is not None else 2, -1)
        self.linear = linear
        self.precision = precision
        self.kernel = GemmKernel(self.chain, precision)

    def produce(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.linear is not None:
            return inputs[0] @ self.linear.weight.t()
        return torch.matmul(inputs[0], inputs[1])

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        a = inputs[0]
        bt = self.linear.weight.detach().t() if self.linear is not None else inputs[1]
        if bt.dim() == 1 or a.dim() == 1:
            raise ValueError("vector operands are not covered")
        out_shape = (*torch.broadcast_shapes(a.shape[:-2], bt.shape[:-2]), a.shape[-2], bt.shape[-1])
        return self.kernel(a, bt, kernel_operands(self.chain, operands, out_shape))

    def describe(self) -> str:
        return f"gemm {self.precision} {super().describe()}"


def find(matcher: Matcher, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
    precision = matcher.precision
    # under ieee, a bare fp32 GEMM is cuBLAS's ground: only a fused epilogue or tensor cores can win it
    worth = has_epilogue_work if precision == "ieee" else None
    if isinstance(mod, nn.Linear) and one_input(node) and len(shape_of(node.args[0]) or ()) >= 2:
        linear = mod

        def make_linear(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
            return GemmRegion(linear, chain, sources, precision)

        anchor = Anchor("gemm", [node.args[0]], -1, make_linear, worth=worth)  # type: ignore[list-item]
        if linear.bias is not None:
            anchor.chain.append(Step("add", "channel"))
            anchor.sources.append(("param", "linear.bias"))
        return anchor
    is_matmul = (node.op == "call_function" and node.target in (torch.matmul, operator.matmul, torch.bmm,
                                                               torch.mm)) or \
        (node.op == "call_method" and node.target in ("matmul", "bmm", "mm"))
    if not (is_matmul and len(node.args) == 2 and not node.kwargs and all(isinstance(a, fx.Node) for a in node.args)):
        return None
    a, b = node.args
    sa, sb = shape_of(a), shape_of(b)
    if sa is None or sb is None or len(sa) < 2 or len(sb) < 2 or dtype_of(a) != torch.float32 \
            or dtype_of(b) != torch.float32:
        return None

    def make_matmul(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return GemmRegion(None, chain, sources, precision)

    return Anchor("gemm", [a, b], -1, make_matmul, worth=worth)  # type: ignore[list-item]


def has_epilogue_work(chain: Sequence[Step]) -> bool:
    """More than a bias add: the bias alone is what cuBLAS's addmm does too."""
    return any(not (s.op == "add" and s.operand == "channel") for s in chain) or len(chain) > 1
