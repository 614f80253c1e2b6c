"""GEMMs (templates.gemm): nn.Linear and F.linear (the bias the chain's first step), torch.matmul, @, bmm and mm, as
functions or methods. A bare fp32 GEMM is left to cuBLAS under `ieee` (Anchor.worth)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from farm_agent.tuner.templates.conv import kernel_operands
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.gemm import GemmKernel
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, one_input, shape_of

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


class GemmRegion(TemplateRegion):
    """a @ bt, where bt is the second input (matmul, bmm), the transpose of the second input (F.linear's weight,
    `weight_input`) or the transpose of a held Linear's weight."""

    kind = "gemm"

    def __init__(self, linear: nn.Module | None, chain: Sequence[Step], sources: Sequence[tuple[str, Any]],
                 precision: str, weight_input: bool = False) -> None:
        super().__init__(chain, sources, 1 if linear is not None else 2, -1)
        self.linear = linear
        self.precision = precision
        self.weight_input = weight_input
        self.kernel = GemmKernel(self.chain, precision)

    def produce(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.linear is not None:
            return inputs[0] @ self.linear.weight.t()
        if self.weight_input:
            return F.linear(inputs[0], inputs[1])
        return torch.matmul(inputs[0], inputs[1])

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        a = inputs[0]
        if self.linear is not None:
            bt = self.linear.weight.detach().t()
        else:
            bt = inputs[1].t() if self.weight_input else inputs[1]
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
    if node.op == "call_function" and node.target is F.linear:
        return _functional_linear(node, precision, worth)
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


def _functional_linear(node: fx.Node, precision: str, worth: Any) -> Anchor | None:
    """F.linear(x, weight, bias): x @ weight.t(), the bias (a graph operand) the chain's first step."""
    args = dict(zip(("input", "weight", "bias"), node.args, strict=False)) | dict(node.kwargs)
    x, weight, bias = args.pop("input", None), args.pop("weight", None), args.pop("bias", None)
    if args or not isinstance(x, fx.Node) or not isinstance(weight, fx.Node) \
            or not (bias is None or isinstance(bias, fx.Node)):
        return None
    sx, sw = shape_of(x), shape_of(weight)
    if sx is None or sw is None or len(sx) < 2 or len(sw) != 2 or dtype_of(x) != torch.float32 \
            or dtype_of(weight) != torch.float32 or (bias is not None and shape_of(bias) != (sw[0],)):
        return None

    def make_linear(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return GemmRegion(None, chain, sources, precision, weight_input=True)

    anchor = Anchor("gemm", [x, weight], -1, make_linear, worth=worth)
    if bias is not None:
        anchor.chain.append(Step("add", "channel"))
        anchor.sources.append(("arg", 0))
        anchor.operand_nodes.append(bias)
    return anchor


def has_epilogue_work(chain: Sequence[Step]) -> bool:
    """More than a bias add: the bias alone is what cuBLAS's addmm does too."""
    return any(not (s.op == "add" and s.operand == "channel") for s in chain) or len(chain) > 1
