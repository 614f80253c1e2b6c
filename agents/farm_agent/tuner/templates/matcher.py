"""The fx matcher: finds the regions of a model that a template covers and rewrites the model to call them.

A region is an anchor (a convolution, a GEMM, pairwise distances, scaled dot-product attention, a pooling, a row
reduction or normalisation, a cross-entropy, a cumsum or cumprod along the last dim, an embedding lookup) and the
elementwise chain that follows it: each next node is the previous one's only user and applies one elementwise op to
it, with at most one other operand that is a number, a per-channel vector (a bias, a BatchNorm in eval, a learned
scale) or a tensor of the output's own shape (a residual). The anchor can be a module (nn.Conv2d, nn.Linear,
nn.MaxPool3d, nn.GroupNorm, nn.CrossEntropyLoss, nn.Embedding ...), a function (F.linear, torch.matmul, torch.cdist,
F.scaled_dot_product_attention, torch.softmax, F.cross_entropy, F.embedding ...) or a method (x.softmax(-1),
x.mean(...)), written anywhere in the forward: the graph is what is matched, not the module tree. Everything else
stays as it was, for eager or Inductor to run.

Shapes come from one run of the model on its example inputs (fx's ShapeProp): an operand is classified by its shape
against the region's output. A model fx cannot trace as a whole has its children matched one by one.

The rewritten regions (TemplateRegion) keep the original modules and parameters and run in PyTorch wherever Triton
cannot (CPU tensors without TRITON_INTERPRET=1, other dtypes), and after a template failed to compile: so a
rewritten model is always callable, and on a CPU it is checked against the original in the tests.
"""

from __future__ import annotations

import copy
import math
import operator
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.experimental.meta_tracer import gen_constructor_wrapper
from torch.fx.passes.shape_prop import ShapeProp

from farm_agent.tuner.templates import codegen, epilogue
from farm_agent.tuner.templates.attention import AttentionKernel, head_dims_covered, torch_attention
from farm_agent.tuner.templates.conv import ConvKernel, ConvSpec, kernel_operands, torch_conv
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.gather import ID_DTYPES, GatherKernel
from farm_agent.tuner.templates.gemm import GemmKernel
from farm_agent.tuner.templates.pool import PoolKernel, PoolSpec, torch_pool
from farm_agent.tuner.templates.prologue import CausalFill, Item, Prologue, tensor_steps
from farm_agent.tuner.templates.prologue import describe as describe_prologue
from farm_agent.tuner.templates.prologue import reference as prologue_reference
from farm_agent.tuner.templates.rowreduce import ROW_OUTPUT, RowKernel, RowSpec, torch_rows
from farm_agent.tuner.templates.scan import ScanKernel, ScanSpec, torch_scan

PRECISIONS = ("ieee", "tf32x3", "tf32")


def triton_runs_on(x: torch.Tensor) -> bool:
    return codegen.triton_available() and (x.is_cuda or codegen.interpreting())


# --- the rewritten regions ---------------------------------------------------------------------------------------


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


class DistanceRegion(TemplateRegion):
    """torch.cdist(x, y) (p = 2, in PyTorch's matrix form): the distance GEMM, its chain on the distances."""

    kind = "distance"

    def __init__(self, chain: Sequence[Step], sources: Sequence[tuple[str, Any]], precision: str) -> None:
        super().__init__(chain, sources, 2, -1)
        self.precision = precision
        self.kernel = GemmKernel(self.chain, precision, distance=True)

    def produce(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cdist(x, y, compute_mode="use_mm_for_euclid_dist")

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        x, y = inputs
        out_shape = (*torch.broadcast_shapes(x.shape[:-2], y.shape[:-2]), x.shape[-2], y.shape[-2])
        return self.kernel(x, y.transpose(-1, -2), kernel_operands(self.chain, operands, out_shape))

    def describe(self) -> str:
        return f"cdist {self.precision} {super().describe()}"


class AttentionRegion(TemplateRegion):
    """F.scaled_dot_product_attention(q, k, v) without a mask or dropout: the flash-attention template, its chain
    on the output (channel: the value head dim)."""

    kind = "attention"

    def __init__(self, causal: bool, scale: float | None, chain: Sequence[Step], sources: Sequence[tuple[str, Any]],
                 precision: str) -> None:
        super().__init__(chain, sources, 3, -1)
        self.causal, self.scale, self.precision = causal, scale, precision
        self.kernel = AttentionKernel(self.chain, precision, causal, scale)

    def produce(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch_attention(q, k, v, self.causal, self.scale)

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        q, k, v = inputs
        out_shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]), q.shape[-2], v.shape[-1])
        return self.kernel(q, k, v, kernel_operands(self.chain, operands, out_shape))

    def describe(self) -> str:
        return f"attention{' causal' if self.causal else ''} {self.precision} {super().describe()}"


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


class RowRegion(TemplateRegion):
    """A row op with the elementwise prologue before it and the chain after it: forward(x, *the prologue's
    tensors, *the chain's operands)."""

    kind = "rows"

    def __init__(self, spec: RowSpec, norm: nn.Module | None, chain: Sequence[Step],
                 sources: Sequence[tuple[str, Any]], channel_dim: int, prologue: Prologue = ()) -> None:
        super().__init__(chain, sources, 1 + len(tensor_steps(prologue)), channel_dim)
        self.spec = spec
        self.norm = norm
        self.prologue = tuple(prologue)
        self.kernel = RowKernel(spec, self.chain, self.prologue)

    def _affine(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.norm is None:
            return None, None
        return getattr(self.norm, "weight", None), getattr(self.norm, "bias", None)

    def produce(self, x: torch.Tensor, *pro_operands: torch.Tensor) -> torch.Tensor:
        weight, bias = self._affine()
        return torch_rows(prologue_reference(x, self.prologue, pro_operands), self.spec, weight, bias)

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        x = inputs[0]
        weight, bias = self._affine()
        out_shape = self.spec.output_shape(x.shape)
        channels = out_shape[self.channel_dim % len(out_shape)] if self.spec.op in ROW_OUTPUT and out_shape else 1
        return self.kernel(x, weight.detach() if weight is not None else None,
                           bias.detach() if bias is not None else None,
                           kernel_operands(self.chain, operands, out_shape), channels=channels,
                           pro_operands=inputs[1:])

    def describe(self) -> str:
        before = f"{describe_prologue(self.prologue)} " if self.prologue else ""
        return f"{before}{self.spec.op} {super().describe()}"


class ScanRegion(TemplateRegion):
    """A cumsum or cumprod along the last dim (templates.scan), its chain on the running values."""

    kind = "scan"

    def __init__(self, spec: ScanSpec, chain: Sequence[Step], sources: Sequence[tuple[str, Any]]) -> None:
        super().__init__(chain, sources, 1, -1)
        self.spec = spec
        self.kernel = ScanKernel(spec, self.chain)

    def produce(self, x: torch.Tensor) -> torch.Tensor:
        return torch_scan(x, self.spec)

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        x = inputs[0]
        return self.kernel(x, kernel_operands(self.chain, operands, x.shape))

    def describe(self) -> str:
        return f"{self.spec.op} {super().describe()}"


class GatherRegion(TemplateRegion):
    """An embedding lookup (templates.gather), its chain on the looked-up rows (channel: the row's D):
    forward(ids, *the chain's operands) with the nn.Embedding held, or forward(ids, table, *operands) for
    F.embedding / torch.embedding."""

    kind = "gather"

    def __init__(self, embedding: nn.Embedding | None, options: dict[str, Any], chain: Sequence[Step],
                 sources: Sequence[tuple[str, Any]]) -> None:
        super().__init__(chain, sources, 1 if embedding is not None else 2, -1)
        self.embedding = embedding
        self.options = dict(options)  # F.embedding's padding_idx, scale_grad_by_freq: the gradients' business
        self.kernel = GatherKernel(self.chain)

    def table(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.embedding.weight if self.embedding is not None else inputs[1]

    def float_tensors(self, inputs: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        return [self.table(inputs)]  # the ids are integers

    def produce(self, ids: torch.Tensor, *table: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            return self.embedding(ids)
        return F.embedding(ids, table[0], **self.options)

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        ids, table = inputs[0], self.table(inputs).detach()
        return self.kernel(table, ids, kernel_operands(self.chain, operands, (*ids.shape, table.shape[-1])))

    def describe(self) -> str:
        return f"embedding {super().describe()}"


class CrossEntropyRegion(TemplateRegion):
    """F.cross_entropy(logits [N, C], class indices [N]) without class weights or label smoothing: each row's loss
    (its logsumexp minus its target's logit) in one read of the row, then PyTorch's reduction of the N losses."""

    kind = "rows"

    def __init__(self, spec: RowSpec, reduction: str, chain: Sequence[Step], sources: Sequence[tuple[str, Any]]
                 ) -> None:
        super().__init__(chain, sources, 2, 0)
        if chain and reduction != "none":
            raise ValueError("a reduced loss has no elementwise chain")
        self.float_inputs = 1
        self.spec, self.reduction = spec, reduction
        self.kernel = RowKernel(spec, self.chain)

    def produce(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets, ignore_index=self.spec.ignore_index, reduction=self.reduction)

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        logits, targets = inputs
        if logits.dim() != 2 or targets.dtype != torch.int64:
            raise ValueError("class indices of [N, C] logits only")
        losses = self.kernel(logits, None, None, kernel_operands(self.chain, operands, targets.shape),
                             channels=targets.shape[0], targets=targets)
        if self.reduction == "none":
            return losses
        total = losses.sum()
        return total if self.reduction == "sum" else total / (targets != self.spec.ignore_index).sum()

    def describe(self) -> str:
        return f"cross_entropy {self.reduction} {super().describe()}"


# --- matching -----------------------------------------------------------------------------------------------------


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


def _shape(node: Any) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def _dtype(node: Any) -> torch.dtype | None:
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return getattr(meta, "dtype", None)


def _ints(value: Any, n: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (int(value),) * n


def _dim_list(value: Any, ndim: int) -> list[int] | None:
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, int) for v in value):
        return None
    return sorted(v % ndim for v in value)


ACT_MODULES: dict[type, str] = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh",
                                nn.Hardswish: "hardswish", nn.Hardsigmoid: "hardsigmoid", nn.Mish: "mish"}
ACT_FUNCTIONS: dict[Any, str] = {
    F.relu: "relu", torch.relu: "relu", F.silu: "silu", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid",
    torch.tanh: "tanh", F.tanh: "tanh", F.hardswish: "hardswish", F.hardsigmoid: "hardsigmoid", F.mish: "mish",
    torch.exp: "exp", torch.abs: "abs", torch.neg: "neg", operator.neg: "neg", torch.square: "square",
}
ACT_METHODS = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "abs": "abs", "neg": "neg",
               "square": "square"}
BINARY_FUNCTIONS: dict[Any, str] = {operator.add: "add", torch.add: "add", operator.sub: "sub", torch.sub: "sub",
                                    operator.mul: "mul", torch.mul: "mul", operator.truediv: "div", torch.div: "div"}
BINARY_METHODS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div"}
REVERSED = {"add": "add", "mul": "mul", "sub": "rsub", "div": "rdiv"}


class Matcher:
    def __init__(self, gm: fx.GraphModule, precision: str) -> None:
        self.gm = gm
        self.precision = precision
        self.modules = dict(gm.named_modules())

    def module(self, node: fx.Node) -> nn.Module | None:
        return self.modules.get(str(node.target)) if node.op == "call_module" else None

    # anchors

    def anchor(self, node: fx.Node) -> Anchor | None:
        try:
            return self._anchor(node)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError):
            return None  # a form the templates do not cover (asymmetric padding, ceil_mode ...)

    def _anchor(self, node: fx.Node) -> Anchor | None:
        mod = self.module(node)
        out = _shape(node)
        if out is None or _dtype(node) != torch.float32:
            return None
        precision = self.precision
        one_input = len(node.args) == 1 and not node.kwargs and isinstance(node.args[0], fx.Node)
        if isinstance(mod, nn.modules.conv._ConvNd) and one_input:
            ConvSpec.of(mod)  # raises where the templates do not cover it
            conv = mod

            def make_conv(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
                return ConvRegion(conv, chain, sources, precision)

            anchor = Anchor("conv", [node.args[0]], 1, make_conv)  # type: ignore[list-item]
            if conv.bias is not None:
                anchor.chain.append(Step("add", "channel"))
                anchor.sources.append(("param", "conv.bias"))
            return anchor
        if isinstance(mod, nn.Linear) and one_input and len(_shape(node.args[0]) or ()) >= 2:
            linear = mod

            def make_linear(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
                return GemmRegion(linear, chain, sources, precision)

            anchor = Anchor("gemm", [node.args[0]], -1, make_linear)  # type: ignore[list-item]
            if linear.bias is not None:
                anchor.chain.append(Step("add", "channel"))
                anchor.sources.append(("param", "linear.bias"))
            return anchor
        is_matmul = (node.op == "call_function" and node.target in (torch.matmul, operator.matmul, torch.bmm,
                                                                   torch.mm)) or \
            (node.op == "call_method" and node.target in ("matmul", "bmm", "mm"))
        if is_matmul and len(node.args) == 2 and not node.kwargs and all(isinstance(a, fx.Node) for a in node.args):
            a, b = node.args
            sa, sb = _shape(a), _shape(b)
            if sa is None or sb is None or len(sa) < 2 or len(sb) < 2 or _dtype(a) != torch.float32 \
                    or _dtype(b) != torch.float32:
                return None

            def make_matmul(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
                return GemmRegion(None, chain, sources, precision)

            return Anchor("gemm", [a, b], -1, make_matmul)  # type: ignore[list-item]
        if node.op == "call_function" and node.target is torch.cdist:
            return self._distance(node)
        if node.op == "call_function" and node.target is F.scaled_dot_product_attention:
            return self._attention(node)
        if isinstance(mod, nn.CrossEntropyLoss) or (node.op == "call_function" and node.target is F.cross_entropy):
            return self._cross_entropy(node, mod)
        if isinstance(mod, nn.Embedding) or (node.op == "call_function" and node.target in (F.embedding,
                                                                                           torch.embedding)):
            return self._gather(node, mod)
        pool = self._pool(node, mod)
        if pool is not None:
            spec = pool

            def make_pool(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
                return PoolRegion(spec, chain, sources)

            return Anchor("pool", [node.args[0]], -(spec.dims + 1), make_pool)  # type: ignore[list-item]
        scan = self._scan(node)
        if scan is not None:
            return scan
        return self._rows(node, mod, out)

    def _scan(self, node: fx.Node) -> Anchor | None:
        """torch.cumsum / torch.cumprod (function or method) along the last dim, in fp32 (no other dtype)."""
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
        if not ((node.op == "call_method" and name in ("cumsum", "cumprod"))
                or (node.op == "call_function" and node.target in (torch.cumsum, torch.cumprod))):
            return None
        args = dict(zip(("input", "dim"), node.args, strict=False)) | dict(node.kwargs)
        x, dim = args.pop("input", None), args.pop("dim", None)
        dtype = args.pop("dtype", None)
        if not isinstance(x, fx.Node) or not isinstance(dim, int) or dtype not in (None, torch.float32) or args:
            return None
        shape = _shape(x)
        if shape is None or not shape or _dtype(x) != torch.float32 or dim % len(shape) != len(shape) - 1:
            return None
        spec = ScanSpec(str(name))

        def make_scan(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
            return ScanRegion(spec, chain, sources)

        return Anchor("scan", [x], -1, make_scan)

    def _gather(self, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
        """nn.Embedding, F.embedding or torch.embedding of an fp32 [V, D] table by int32 or int64 ids of any shape.
        Not with max_norm (the lookup renormalises the table's rows in place) or sparse gradients (left to PyTorch);
        padding_idx and scale_grad_by_freq change only the gradients, so those lookups are matched."""
        if isinstance(mod, nn.Embedding):
            if len(node.args) != 1 or node.kwargs or mod.max_norm is not None or mod.sparse:
                return None
            ids, table, embedding, options = node.args[0], mod.weight, mod, {}
        else:
            functional = node.target is F.embedding  # torch.embedding(weight, indices, ...) takes them the other way
            names = ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse") \
                if functional else ("weight", "indices", "padding_idx", "scale_grad_by_freq", "sparse")
            args = dict(zip(names, node.args, strict=False)) | dict(node.kwargs)
            ids, table = args.pop("input" if functional else "indices", None), args.pop("weight", None)
            if args.get("max_norm") is not None or args.get("sparse", False) \
                    or any(isinstance(v, fx.Node) for v in args.values()):
                return None
            padding = args.get("padding_idx")
            if not functional and padding is not None and padding < 0:  # torch.embedding's -1: none
                padding = None
            options = {"padding_idx": padding, "scale_grad_by_freq": bool(args.get("scale_grad_by_freq", False))}
            embedding = None
        shape = table.shape if isinstance(table, torch.Tensor) else _shape(table)
        dtype = table.dtype if isinstance(table, torch.Tensor) else _dtype(table)
        if not isinstance(ids, fx.Node) or _dtype(ids) not in ID_DTYPES or shape is None or len(shape) != 2 \
                or dtype != torch.float32 or (embedding is None and not isinstance(table, fx.Node)):
            return None

        def make_gather(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
            return GatherRegion(embedding, options, chain, sources)

        return Anchor("gather", [ids] if embedding is not None else [ids, table], -1, make_gather)

    def _distance(self, node: fx.Node) -> Anchor | None:
        """torch.cdist(x, y, p=2) where PyTorch itself takes its matrix form (the same arithmetic as the template;
        where it computes the differences directly, near-equal rows keep more digits than a product form can)."""
        args = dict(zip(("x1", "x2", "p", "compute_mode"), node.args, strict=False)) | dict(node.kwargs)
        x, y = args.get("x1"), args.get("x2")
        mode = args.get("compute_mode") or "use_mm_for_euclid_dist_if_necessary"
        if not isinstance(x, fx.Node) or not isinstance(y, fx.Node) or float(args.get("p", 2.0)) != 2.0:
            return None
        sx, sy = _shape(x), _shape(y)
        if sx is None or sy is None or len(sx) < 2 or len(sy) < 2 or {_dtype(x), _dtype(y)} != {torch.float32}:
            return None
        if mode == "donot_use_mm_for_euclid_dist" or (mode == "use_mm_for_euclid_dist_if_necessary"
                                                       and sx[-2] <= 25 and sy[-2] <= 25):
            return None
        precision = self.precision

        def make_distance(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
            return DistanceRegion(chain, sources, precision)

        return Anchor("distance", [x, y], -1, make_distance)

    def _attention(self, node: fx.Node) -> Anchor | None:
        """F.scaled_dot_product_attention of fp32 q [..., Lq, D], k [..., Lk, D], v [..., Lk, DV] (head dims powers
        of two from 16 to 128) without attn_mask, dropout or enable_gqa, causal or not, at the tensor-core precisions
        only: with fp32 FMA the template does the same arithmetic as PyTorch's own fp32 attention kernels and is
        unlikely to beat them (as a bare fp32 GEMM is left to cuBLAS), while split-TF32 products run on the tensor
        cores, past the fp32 CUDA-core peak those kernels are bound by."""
        if self.precision == "ieee":
            return None
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        args = dict(zip(names, node.args, strict=False)) | dict(node.kwargs)
        q, k, v = args.get("query"), args.get("key"), args.get("value")
        causal, scale = args.get("is_causal", False), args.get("scale")
        if not all(isinstance(t, fx.Node) for t in (q, k, v)) or args.get("attn_mask") is not None \
                or args.get("dropout_p", 0.0) != 0.0 or args.get("enable_gqa", False) or not isinstance(causal, bool) \
                or not (scale is None or (isinstance(scale, (int, float)) and not isinstance(scale, bool))):
            return None
        shapes = [_shape(t) for t in (q, k, v)]
        if any(s is None or len(s) < 2 for s in shapes) or {_dtype(t) for t in (q, k, v)} != {torch.float32}:
            return None
        (sq, sk, sv), precision = shapes, self.precision
        if sq[-1] != sk[-1] or sk[-2] != sv[-2] or not head_dims_covered(sq[-1], sv[-1]) or 0 in (sq[-2], sk[-2]):
            return None
        try:
            torch.broadcast_shapes(sq[:-2], sk[:-2], sv[:-2])
        except RuntimeError:  # batch dims that do not broadcast
            return None

        def make_attention(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
            return AttentionRegion(causal, None if scale is None else float(scale), chain, sources, precision)

        return Anchor("attention", [q, k, v], -1, make_attention)  # type: ignore[list-item]

    def _cross_entropy(self, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
        """F.cross_entropy / nn.CrossEntropyLoss of [N, C] fp32 logits and int64 class indices, without class weights
        or label smoothing (any ignore_index; reduction mean, sum or none)."""
        names = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")
        args = dict(zip(names[:2] if mod is not None else names, node.args, strict=False)) | dict(node.kwargs)
        if mod is not None:
            args |= {"weight": mod.weight, "ignore_index": mod.ignore_index, "reduction": mod.reduction,
                     "label_smoothing": mod.label_smoothing}
        logits, targets = args.get("input"), args.get("target")
        if not isinstance(logits, fx.Node) or not isinstance(targets, fx.Node) or args.get("weight") is not None \
                or args.get("size_average") is not None or args.get("reduce") is not None \
                or args.get("label_smoothing", 0.0) != 0.0:
            return None
        reduction, ignore = args.get("reduction", "mean"), args.get("ignore_index", -100)
        shape, target_shape = _shape(logits), _shape(targets)
        if reduction not in ("mean", "sum", "none") or not isinstance(ignore, int) or shape is None \
                or len(shape) != 2 or target_shape != shape[:1] or _dtype(logits) != torch.float32 \
                or _dtype(targets) != torch.int64:
            return None
        spec = RowSpec("cross_entropy", ignore_index=ignore)

        def make_loss(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
            return CrossEntropyRegion(spec, reduction, chain, sources)

        return Anchor("rows", [logits, targets], 0, make_loss, allows_channel=False, chainable=reduction == "none")

    def _pool(self, node: fx.Node, mod: nn.Module | None) -> PoolSpec | None:
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

    def _rows(self, node: fx.Node, mod: nn.Module | None, out: tuple[int, ...]) -> Anchor | None:
        x = node.args[0] if node.args else None
        if not isinstance(x, fx.Node):
            return None
        shape = _shape(x)
        if shape is None or _dtype(x) != torch.float32 or not shape:
            return None
        ndim = len(shape)
        norm: nn.Module | None = None
        spec: RowSpec | None = None
        channel_dim = -1
        if isinstance(mod, nn.LayerNorm) and len(node.args) == 1:
            spec = RowSpec("layer_norm", reduced=len(mod.normalized_shape), eps=mod.eps)
            norm = mod
        elif isinstance(mod, nn.RMSNorm) and len(node.args) == 1:
            eps = mod.eps if mod.eps is not None else torch.finfo(torch.float32).eps
            spec = RowSpec("rms_norm", reduced=len(mod.normalized_shape), eps=eps)
            norm = mod
        elif isinstance(mod, nn.GroupNorm) and len(node.args) == 1 and ndim >= 2:
            spec = RowSpec("group_norm", eps=mod.eps, groups=mod.num_groups)
            norm = mod if mod.affine else None
            channel_dim = 1
        elif isinstance(mod, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)) \
                and len(node.args) == 1:
            dims = int(type(mod).__name__[-2])
            if set(_ints(mod.output_size, dims)) != {1}:
                return None
            spec = RowSpec("mean", reduced=dims, keepdim=True)
            channel_dim = ndim - dims - 1
        elif isinstance(mod, (nn.Softmax, nn.LogSoftmax)) and len(node.args) == 1:
            if mod.dim is None or mod.dim % ndim != ndim - 1:
                return None
            spec = RowSpec("softmax" if isinstance(mod, nn.Softmax) else "log_softmax")
        else:
            spec, channel_dim = self._row_call(node, ndim)
            written = self._rms_written_out(node, spec)
            if written is not None:
                return written
        if spec is None:
            return None
        if spec.op == "group_norm" and ndim < 3:
            return None
        if spec.op in ROW_OUTPUT:
            out_nd = len(spec.output_shape(shape))
            if out_nd == 0:
                return None
            channel_dim = out_nd - 1 if not spec.keepdim else ndim - spec.reduced - 1
            if channel_dim < 0:
                return None
        start, prologue, absorbed, pro_operands, builders = self._prologue(x, spec)
        row_spec, row_norm, cd = spec, norm, channel_dim

        def make_rows(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
            return RowRegion(row_spec, row_norm, chain, sources, cd, prologue)

        # a multi-dim LayerNorm's feature index spans several dims: a per-channel operand would not be one vector
        allows = not (spec.op in ("layer_norm", "rms_norm") and spec.reduced > 1)
        return Anchor("rows", [start, *pro_operands], channel_dim, make_rows, allows_channel=allows,
                      absorbed=absorbed, builders=builders)

    def _rms_written_out(self, mean: fx.Node, spec: RowSpec | None) -> Anchor | None:
        """RMSNorm as models write it out: x * rsqrt(mean(x², -1, keepdim=True) + eps), the square as x.pow(2),
        x ** 2, torch.square(x) or x * x; each node between read by the next alone. The anchor is the mean, the
        region's value the product (what follows it, a weight included, is its chain)."""
        if spec is None or spec.op != "mean" or spec.reduced != 1 or not spec.keepdim:
            return None
        square = mean.args[0]
        if not isinstance(square, fx.Node) or len(square.users) != 1:
            return None
        x = _squared(square)
        added = _only_user(mean)
        if x is None or added is None or _name(added) != "add" or len(added.args) != 2 or added.kwargs:
            return None
        eps = added.args[1] if added.args[0] is mean else added.args[0]
        root = _only_user(added)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or root is None or _name(root) != "rsqrt":
            return None
        product = _only_user(root)
        if product is None or _name(product) != "mul" or product.kwargs or set(product.args) != {x, root} \
                or _shape(product) != _shape(x):
            return None
        rms = RowSpec("rms_norm", eps=float(eps))

        def make_rms(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
            return RowRegion(rms, None, chain, sources, -1)

        return Anchor("rows", [x], -1, make_rms, absorbed=[root, added, mean, square], end=product)

    def _prologue(self, x: fx.Node, spec: RowSpec
                  ) -> tuple[fx.Node, Prologue, list[fx.Node], list[fx.Node], list[fx.Node]]:
        """The elementwise ops before a row op that only it reads, walking back from its input while each node is
        its successor's only input of the input's shape: numbers, activations, clamps, tensors of the input's shape
        and one causal masked_fill (rows along the last dim only). Returns (the region's input, the prologue, its
        nodes nearest the anchor first, its tensors, the nodes that built its mask)."""
        shape = _shape(x)
        items: list[Item] = []
        absorbed: list[fx.Node] = []
        operands: list[fx.Node] = []
        builders: list[fx.Node] = []
        stub = Anchor("rows", [], -1, lambda chain, sources: None,  # type: ignore[arg-type,return-value]
                      allows_channel=False)  # what self.step needs to know: no per-channel operands
        causal_ok = spec.reduced == 1 and spec.op != "group_norm" and shape is not None and len(shape) >= 2
        node = x
        while len(node.users) == 1 and node.op in ("call_function", "call_method", "call_module") \
                and _shape(node) == shape and _dtype(node) == torch.float32:
            fill = self._causal_fill(node, shape) if causal_ok and not builders else None  # type: ignore[arg-type]
            if fill is not None:
                item, source, made = fill
                builders.extend(made)
            else:
                source = next((a for a in node.args if isinstance(a, fx.Node) and _shape(a) == shape
                               and _dtype(a) == torch.float32), None)
                if source is None:
                    break
                item, operand = self.step(node, source, stub)
                if item is None or isinstance(operand, nn.Module):
                    break
                if operand is not None:
                    operands.append(operand)
            items.append(item)
            absorbed.append(node)
            node = source
        return node, tuple(reversed(items)), absorbed, operands[::-1], builders

    def _causal_fill(self, node: fx.Node, shape: tuple[int, ...]
                     ) -> tuple[CausalFill, fx.Node, list[fx.Node]] | None:
        """x.masked_fill(mask, number) where mask is torch.ones(Q, K).triu(k) or .tril(k) (a function or a method,
        any dtype made bool, or its complement ~mask) over x's last two dims: (the fill, x, the mask's nodes)."""
        if not ((node.op == "call_method" and node.target == "masked_fill")
                or (node.op == "call_function" and node.target in (torch.masked_fill, torch.Tensor.masked_fill))):
            return None
        args = dict(zip(("input", "mask", "value"), node.args, strict=False)) | dict(node.kwargs)
        source, mask, value = args.get("input"), args.get("mask"), args.get("value")
        if not isinstance(source, fx.Node) or not isinstance(mask, fx.Node) or isinstance(value, bool) \
                or not isinstance(value, (int, float)) or len(args) != 3:
            return None
        mask_shape = _shape(mask)
        if mask_shape is None or _dtype(mask) != torch.bool or mask_shape[-2:] != shape[-2:] \
                or any(s != 1 for s in mask_shape[:-2]) or len(mask_shape) > len(shape):
            return None
        made: list[fx.Node] = []
        flipped = False
        m = mask
        while True:  # a complement, or a conversion to bool, on the way back to the triangle
            made.append(m)
            if (m.op == "call_function" and m.target in (operator.invert, torch.logical_not)) \
                    or (m.op == "call_method" and m.target in ("logical_not", "bitwise_not")):
                flipped = not flipped
            elif not ((m.op == "call_method" and m.target == "bool" and len(m.args) == 1 and not m.kwargs)
                      or (m.op == "call_method" and m.target == "to" and m.args[1:] == (torch.bool,)
                          and not m.kwargs)):
                break
            if not isinstance(m.args[0], fx.Node):
                return None
            m = m.args[0]
        part = m.target if m.op == "call_method" else getattr(m.target, "__name__", None)
        if part not in ("triu", "tril") or (m.op == "call_function" and m.target not in (torch.triu, torch.tril)):
            return None
        triangle = dict(zip(("input", "diagonal"), m.args, strict=False)) | dict(m.kwargs)
        ones, diagonal = triangle.pop("input", None), triangle.pop("diagonal", 0)
        if triangle or not isinstance(diagonal, int) or not isinstance(ones, fx.Node) \
                or not (ones.op == "call_function" and ones.target is torch.ones):
            return None
        made.append(ones)
        if flipped:  # ~triu(k) is tril(k - 1), ~tril(k) is triu(k + 1)
            part, diagonal = ("tril", diagonal - 1) if part == "triu" else ("triu", diagonal + 1)
        return CausalFill(str(part), diagonal, float(value)), source, made

    def _row_call(self, node: fx.Node, ndim: int) -> tuple[RowSpec | None, int]:
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
        if node.op not in ("call_function", "call_method") or not isinstance(name, str):
            return None, -1
        normalize = self._normalize_call(node, ndim)
        if normalize is not None:
            return normalize, -1
        if node.op == "call_function" and node.target not in (torch.softmax, F.softmax, torch.log_softmax,
                                                                F.log_softmax, torch.logsumexp, torch.sum, torch.mean,
                                                                torch.amax):
            return None, -1
        args, kwargs = list(node.args[1:]), dict(node.kwargs)
        if set(kwargs) - {"dim", "keepdim"} or any(isinstance(a, fx.Node) for a in [*args, *kwargs.values()]):
            return None, -1
        dim = args[0] if args else kwargs.get("dim")
        keepdim = bool(args[1] if len(args) > 1 else kwargs.get("keepdim", False))
        dims = _dim_list(dim, ndim)
        if dims is None:
            return None, -1
        reduced = len(dims)
        if dims != list(range(ndim - reduced, ndim)):  # only trailing dims form contiguous rows
            return None, -1
        if name in ("softmax", "log_softmax"):
            return (RowSpec(name) if reduced == 1 and len(args) <= 1 else None), -1
        if name in ("logsumexp", "sum", "mean", "amax"):
            return RowSpec(name, reduced=reduced, keepdim=keepdim), -1
        return None, -1

    def _normalize_call(self, node: fx.Node, ndim: int) -> RowSpec | None:
        """F.normalize(x, p=2, dim=<the last>, eps) (a function call; p and dim as numbers)."""
        if node.op != "call_function" or node.target is not F.normalize:
            return None
        args = dict(zip(("input", "p", "dim", "eps"), node.args, strict=False)) | dict(node.kwargs)
        p, dim, eps = args.pop("p", 2.0), args.pop("dim", 1), args.pop("eps", 1e-12)
        if args.pop("out", None) is not None or set(args) != {"input"} or p != 2 or not isinstance(dim, int) \
                or dim % ndim != ndim - 1 or isinstance(eps, bool) or not isinstance(eps, (int, float)):
            return None
        return RowSpec("normalize", eps=float(eps))

    # chains

    def step(self, user: fx.Node, tail: fx.Node, anchor: Anchor) -> tuple[Step | None, Any]:
        """The elementwise step `user` applies to `tail`, and its operand (a node, a BatchNorm, or None)."""
        mod = self.module(user)
        if user.args[:1] != (tail,) and not (user.op == "call_function" and user.target in BINARY_FUNCTIONS) \
                and not (user.op == "call_method" and user.target in BINARY_METHODS):
            return None, None
        if mod is not None:
            if len(user.args) != 1 or user.kwargs:
                return None, None
            if isinstance(mod, (nn.Identity, nn.Dropout)):  # the model runs in eval: Dropout is the identity
                return Step("mul", "scalar", value=1.0), None
            if type(mod) in ACT_MODULES:
                return Step(ACT_MODULES[type(mod)]), None
            if isinstance(mod, nn.GELU):
                return Step("gelu_tanh" if mod.approximate == "tanh" else "gelu"), None
            if isinstance(mod, nn.LeakyReLU):
                return Step("leaky_relu", value=float(mod.negative_slope)), None
            if isinstance(mod, nn.ELU):
                return Step("elu", value=float(mod.alpha)), None
            if isinstance(mod, nn.Softplus) and mod.beta == 1 and mod.threshold == 20:
                return Step("softplus"), None
            if isinstance(mod, nn.Hardtanh):  # ReLU6 too
                return Step("clamp", lo=float(mod.min_val), hi=float(mod.max_val)), None
            if isinstance(mod, nn.modules.batchnorm._BatchNorm) and not mod.training and mod.track_running_stats \
                    and anchor.allows_channel and self._channel_ok(tail, anchor, mod.num_features, bn=True):
                return Step("mul", "channel"), mod
            return None, None
        if user.op == "call_function" and user.target in ACT_FUNCTIONS and len(user.args) == 1 \
                and not set(user.kwargs) - {"inplace"}:
            return Step(ACT_FUNCTIONS[user.target]), None
        if user.op == "call_method" and user.target in ACT_METHODS and len(user.args) == 1 and not user.kwargs:
            return Step(ACT_METHODS[str(user.target)]), None
        if user.op == "call_function" and user.target is F.gelu and len(user.args) == 1:
            if set(user.kwargs) - {"approximate", "inplace"}:
                return None, None
            return Step("gelu_tanh" if user.kwargs.get("approximate") == "tanh" else "gelu"), None
        if user.op == "call_function" and user.target in (F.leaky_relu, F.elu):
            value = user.args[1] if len(user.args) > 1 else user.kwargs.get(
                "negative_slope" if user.target is F.leaky_relu else "alpha", 0.01 if user.target is F.leaky_relu
                else 1.0)
            if not isinstance(value, (int, float)) or set(user.kwargs) - {"negative_slope", "alpha", "inplace"}:
                return None, None
            return Step("leaky_relu" if user.target is F.leaky_relu else "elu", value=float(value)), None
        if (user.op == "call_function" and user.target in (torch.clamp, F.hardtanh, F.relu6)) or \
                (user.op == "call_method" and user.target in ("clamp", "clamp_min", "clamp_max")):
            return self._clamp(user), None
        if (user.op == "call_function" and user.target in (operator.pow, torch.pow)) or \
                (user.op == "call_method" and user.target == "pow"):
            if len(user.args) == 2 and user.args[0] is tail and user.args[1] == 2 and not user.kwargs:
                return Step("square"), None
            return None, None
        op = BINARY_FUNCTIONS.get(user.target) if user.op == "call_function" else \
            BINARY_METHODS.get(str(user.target)) if user.op == "call_method" else None
        if op is None or len(user.args) != 2 or user.kwargs:
            return None, None
        a, b = user.args
        if a is tail and b is tail:
            return (Step("square"), None) if op == "mul" else (None, None)
        if a is tail:
            other = b
        elif b is tail:
            other, op = a, REVERSED[op]
        else:
            return None, None
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return Step(op, "scalar", value=float(other)), None
        if not isinstance(other, fx.Node) or _dtype(other) != torch.float32:
            return None, None
        shape, out = _shape(other), _shape(tail)
        if shape is None or out is None:
            return None, None
        if shape == out:
            return Step(op, "full"), other
        if anchor.allows_channel and self._channel_ok(tail, anchor, None, shape=shape):
            return Step(op, "channel"), other
        return None, None

    def _clamp(self, user: fx.Node) -> Step | None:
        target = user.target
        if target is F.relu6:
            return Step("clamp", lo=0.0, hi=6.0) if len(user.args) == 1 and not set(user.kwargs) - {"inplace"} else None
        names = ("min_val", "max_val") if target is F.hardtanh else ("min", "max")
        args = list(user.args[1:])
        kw = {k: v for k, v in user.kwargs.items() if k != "inplace"}
        if target == "clamp_min":
            lo, hi = (args[0] if args else kw.get("min")), None
        elif target == "clamp_max":
            lo, hi = None, (args[0] if args else kw.get("max"))
        else:
            lo = args[0] if args else kw.get(names[0], -1.0 if target is F.hardtanh else None)
            hi = args[1] if len(args) > 1 else kw.get(names[1], 1.0 if target is F.hardtanh else None)
        if any(v is not None and not isinstance(v, (int, float)) for v in (lo, hi)) or (lo is None and hi is None):
            return None
        return Step("clamp", lo=None if lo is None else float(lo), hi=None if hi is None else float(hi))

    def _channel_ok(self, tail: fx.Node, anchor: Anchor, features: int | None, shape: tuple[int, ...] | None = None,
                    bn: bool = False) -> bool:
        """Whether an operand of `shape` (or a BatchNorm of `features`) is one value per channel of the output."""
        out = _shape(tail)
        if out is None:
            return False
        cd = anchor.channel_dim % len(out)
        if bn:  # BatchNorm normalises dim 1
            return cd == 1 and out[1] == features
        assert shape is not None
        if len(shape) > len(out):
            return False
        aligned = (1,) * (len(out) - len(shape)) + shape
        return all(s == (out[i] if i == cd else 1) for i, s in enumerate(aligned)) and math.prod(shape) == out[cd]

    # the rewrite

    def run(self) -> Counter[str]:
        graph = self.gm.graph
        count: Counter[str] = Counter()
        erased: set[fx.Node] = set()
        for node in list(graph.nodes):
            if node in erased or node.op not in ("call_module", "call_function", "call_method"):
                continue
            anchor = self.anchor(node)
            if anchor is None:
                continue
            tail = anchor.end or node
            chain_nodes = [tail]
            while anchor.chainable and len(tail.users) == 1:
                user = next(iter(tail.users))
                step, operand = self.step(user, tail, anchor)
                if step is None:
                    break
                if isinstance(operand, nn.modules.batchnorm._BatchNorm):
                    index = len(anchor.bns)
                    anchor.bns.append(operand)
                    anchor.chain.extend([Step("mul", "channel"), Step("add", "channel")])
                    anchor.sources.extend([("bn_scale", index), ("bn_shift", index)])
                else:
                    anchor.chain.append(step)
                    if operand is not None:
                        anchor.sources.append(("arg", len(anchor.operand_nodes)))
                        anchor.operand_nodes.append(operand)
                chain_nodes.append(user)
                tail = user
            if anchor.kind == "gemm" and self.precision == "ieee" and not _has_epilogue_work(anchor.chain):
                continue  # a bare fp32 GEMM is cuBLAS's ground: only a fused epilogue or tensor cores can win it
            region = anchor.make(tuple(anchor.chain), anchor.sources)
            region.bns.extend(anchor.bns)
            name = f"farm_template_{sum(count.values())}"
            self.gm.add_submodule(name, region)
            count[region.kind] += 1
            with graph.inserting_after(tail):
                call = graph.call_module(name, (*anchor.inputs, *anchor.operand_nodes))
            call.meta = dict(tail.meta)  # its shape, for the regions matched after it
            tail.replace_all_uses_with(call)
            for old in [*reversed(chain_nodes), *anchor.absorbed]:
                graph.erase_node(old)
                erased.add(old)
            _erase_unused(graph, anchor.builders, erased)
        graph.lint()
        self.gm.recompile()
        return count


# What builds a causal mask (a size read from a shape, ones, a triangle, a complement, a bool): free of side effects
_BUILDER_FUNCTIONS = (torch.ones, torch.triu, torch.tril, operator.getitem, getattr, operator.invert,
                      torch.logical_not)
_BUILDER_METHODS = ("triu", "tril", "bool", "to", "size", "logical_not", "bitwise_not")


def _name(node: fx.Node) -> str | None:
    """An elementwise node's op by name, whether a function, an operator or a method."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return {operator.add: "add", operator.mul: "mul", operator.pow: "pow"}.get(
            node.target, getattr(node.target, "__name__", None))  # type: ignore[arg-type]
    return None


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _squared(node: fx.Node) -> fx.Node | None:
    """x, where node is x.pow(2), x ** 2, torch.square(x) or x * x (no keyword arguments)."""
    name = _name(node)
    if node.kwargs or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if name == "square" and len(node.args) == 1:
        return node.args[0]
    if name == "pow" and len(node.args) == 2 and node.args[1] == 2 and not isinstance(node.args[1], bool):
        return node.args[0]
    if name == "mul" and len(node.args) == 2 and node.args[0] is node.args[1]:
        return node.args[0]
    return None


def _erase_unused(graph: fx.Graph, nodes: Sequence[fx.Node], erased: set[fx.Node]) -> None:
    """Erase the mask builders that nothing reads any more, and their inputs that are builders read by nothing."""
    pending = list(nodes)
    while pending:
        node = pending.pop(0)
        builder = (node.op == "call_function" and node.target in _BUILDER_FUNCTIONS) or \
            (node.op == "call_method" and node.target in _BUILDER_METHODS)
        if node in erased or node.users or not builder:
            continue
        inputs = list(node.all_input_nodes)
        graph.erase_node(node)
        erased.add(node)
        pending.extend(inputs)


def _has_epilogue_work(chain: Sequence[Step]) -> bool:
    """More than a bias add: the bias alone is what cuBLAS's addmm does too."""
    return any(not (s.op == "add" and s.operand == "channel") for s in chain) or len(chain) > 1


# Tensor factories whose sizes or device a model reads from a traced tensor (torch.ones(s.shape[-1], ...,
# device=s.device): fx refuses proxies there, so while tracing they are wrapped to record a node instead.
_FACTORIES = ("ones", "zeros", "full", "empty", "arange", "eye")


_TRACING = threading.Lock()  # the wrapped factories are process-wide: one trace at a time patches them


def _trace(model: nn.Module) -> fx.GraphModule:
    """fx.symbolic_trace, with _FACTORIES taking sizes read from the traced tensors (fx's own MetaTracer wraps
    them the same way; outside a trace, or without a traced value among its arguments, a wrapper calls the factory)."""
    with _TRACING:
        originals = {name: getattr(torch, name) for name in _FACTORIES}
        try:
            for name, factory in originals.items():
                setattr(torch, name, gen_constructor_wrapper(factory)[0])
            tracer = fx.Tracer()
            graph = tracer.trace(model)
        finally:
            for name, factory in originals.items():
                setattr(torch, name, factory)
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


def _rewrite_traced(model: nn.Module, example_inputs: Sequence[Any], precision: str
                    ) -> tuple[fx.GraphModule, Counter[str]]:
    gm = _trace(model)
    with torch.no_grad():
        ShapeProp(gm).propagate(*example_inputs)
    return gm, Matcher(gm, precision).run()


class _Recorder:
    """Records each child module's inputs during one forward (for matching children of an untraceable model)."""

    def __init__(self, model: nn.Module) -> None:
        self.seen: dict[str, tuple[Any, ...]] = {}
        self.handles = [child.register_forward_pre_hook(self._hook(name))
                        for name, child in model.named_children()]

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            self.seen.setdefault(name, args)
        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def rewrite(model: nn.Module, example_inputs: Sequence[Any], precision: str = "ieee"
            ) -> tuple[nn.Module, Counter[str]]:
    """A copy of `model` whose covered regions call template kernels, and how many regions of each kind (conv,
    gemm, distance, attention, pool, rows, scan, gather) it has. `example_inputs`: on the model's device (one
    forward, for the shapes)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}")
    model = copy.deepcopy(model).eval()
    try:
        return _rewrite_traced(model, example_inputs, precision)
    except (fx.proxy.TraceError, TypeError, NotImplementedError, RuntimeError, AttributeError):
        pass
    # Not traceable as a whole (data-dependent control flow ...): its children, each with the inputs it was given.
    recorder = _Recorder(model)
    try:
        with torch.no_grad():
            model(*example_inputs)
    finally:
        recorder.close()
    total: Counter[str] = Counter()
    for name, args in recorder.seen.items():
        child = getattr(model, name)
        try:
            rewritten, count = _rewrite_traced(child, args, precision)
        except (fx.proxy.TraceError, TypeError, NotImplementedError, RuntimeError, AttributeError):
            continue
        if count:
            setattr(model, name, rewritten)
            total.update(count)
    return model, total


def regions(model: nn.Module) -> list[TemplateRegion]:
    return [m for m in model.modules() if isinstance(m, TemplateRegion)]
