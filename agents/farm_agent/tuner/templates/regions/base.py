"""What every region kind shares: the rewritten region's module (TemplateRegion), the matched producer (Anchor) and
the shape and dtype ShapeProp recorded on a node."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from farm_agent.tuner.templates import codegen, epilogue
from farm_agent.tuner.templates.epilogue import Step

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


def triton_runs_on(x: torch.Tensor) -> bool:
    return codegen.triton_available() and (x.is_cuda or codegen.interpreting())


class TemplateRegion(nn.Module):
    """One matched region: the producer (self.produce) and its epilogue chain, through a template kernel where
    Triton runs, else in PyTorch. forward(*inputs, *operands): the producer's tensor inputs, then one tensor per
    graph operand of the chain (sources marked "arg"); other operands are computed from held modules."""

    kind = "region"

    def __init__(self, chain: Sequence[Step], sources: Sequence[tuple[str, Any]], inputs: int,
                 channel_dim: int) -> None:
        super().__init__()
        self.chain = tuple(chain)
        # per tensor operand: ("arg", i) | ("bn_scale", k) | ("bn_shift", k) | ("param", name)
        self.sources = list(sources)
        self.inputs = inputs
        self.channel_dim = channel_dim
        self.bns = nn.ModuleList()
        self.failed = False
        self.float_inputs = inputs  # the leading inputs that must be fp32 for the template (the rest: indices)

    def operands(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        found = []
        for kind, ref in self.sources:
            if kind == "arg":
                found.append(args[ref])
            elif kind == "param":
                found.append(self.get_parameter(ref))
            else:
                bn = self.bns[ref]
                scale = bn.weight / torch.sqrt(bn.running_var + bn.eps) if bn.weight is not None else \
                    1.0 / torch.sqrt(bn.running_var + bn.eps)
                if kind == "bn_scale":
                    found.append(scale)
                else:
                    shift = -bn.running_mean * scale
                    found.append(shift + bn.bias if bn.bias is not None else shift)
        return found

    @torch.compiler.disable  # under torch.compile (the triton-templates-compile family) a region is a graph break
    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        inputs, extra = args[:self.inputs], args[self.inputs:]
        operands = self.operands(extra)
        if not self.failed and all(t.dtype == torch.float32 for t in [*self.float_tensors(inputs), *operands]) \
                and triton_runs_on(inputs[0]):
            try:
                return self.run_template(inputs, operands)
            except Exception as exc:  # a template that does not compile here: this region runs in PyTorch
                self.failed = True
                codegen.record_failure(f"{self.kind}:{self.describe()}", exc)
        return self.run_reference(inputs, operands)

    def float_tensors(self, inputs: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        """The tensors besides the chain's operands that must be fp32 for the template to run."""
        return inputs[:self.float_inputs]

    def run_reference(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        y = self.produce(*inputs)
        return epilogue.reference(y, self.chain, operands, self.channel_dim % y.dim()) if self.chain else y

    def produce(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def describe(self) -> str:
        return epilogue.describe(self.chain) or "-"


@dataclass
class Anchor:
    """A matched producer: how to build its region once the chain is known."""

    kind: str
    inputs: list[fx.Node]
    channel_dim: int  # of its output (negative: from the end)
    make: Callable[[tuple[Step, ...], list[tuple[str, Any]]], TemplateRegion]  # its region, given the chain
    chain: list[Step] = field(default_factory=list)
    sources: list[tuple[str, Any]] = field(default_factory=list)
    operand_nodes: list[fx.Node] = field(default_factory=list)
    bns: list[nn.Module] = field(default_factory=list)
    allows_channel: bool = True
    chainable: bool = True  # False: its output is reduced after the kernel, so no chain is fused into it
    absorbed: list[fx.Node] = field(default_factory=list)  # the prologue's nodes, nearest the anchor first
    builders: list[fx.Node] = field(default_factory=list)  # what built a causal mask: erased once unused
    end: fx.Node | None = None  # the node whose value the producer computes, if not the anchor's own (a norm written
    # out: the anchor is its reduction, the end the product that applies it)
    worth: Callable[[Sequence[Step]], bool] | None = None  # given the whole chain, whether the region beats what
    # PyTorch runs (None: always)


# A region kind's anchor finder: the anchor at `node` (`mod`: the module it calls, if any), or None where the kind
# does not cover it. It may raise ValueError, TypeError, KeyError, AttributeError or IndexError for a form it does
# not cover (the Matcher reads those as None).
Finder = Callable[["Matcher", fx.Node, nn.Module | None], Anchor | None]


def shape_of(node: Any) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def dtype_of(node: Any) -> torch.dtype | None:
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return getattr(meta, "dtype", None)


def one_input(node: fx.Node) -> bool:
    """Whether the node is called with one traced tensor and nothing else (a module's forward(x))."""
    return len(node.args) == 1 and not node.kwargs and isinstance(node.args[0], fx.Node)
