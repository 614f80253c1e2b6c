"""The fx matcher: finds the regions of a model that a template covers and rewrites the model to call them.

A region is an anchor (a convolution, a GEMM, pairwise distances, scaled dot-product attention, a pooling, a row
reduction or normalisation, a cross-entropy, a cumsum or cumprod along the last dim, an embedding lookup, a GRU or an
LSTM) and the elementwise chain that follows it: each next node is the previous one's only user and applies one
elementwise op to it, with at most one other operand that is a number, a per-channel vector (a bias, a BatchNorm in
eval, a learned scale) or a tensor of the output's own shape (a residual). The anchor can be a module (nn.Conv2d,
nn.Linear, nn.MaxPool3d, nn.GroupNorm, nn.CrossEntropyLoss, nn.Embedding ...), a function (F.linear, torch.matmul,
torch.cdist, F.scaled_dot_product_attention, torch.softmax, F.cross_entropy, F.embedding ...) or a method
(x.softmax(-1), x.mean(...)), written anywhere in the forward: the graph is what is matched, not the module tree. Then
the elementwise graphs left over tensors of one shape (regions.pointwise) become one kernel each. Everything else stays
as it was, for eager or Inductor to run.

Shapes come from one run of the model on its example inputs (fx's ShapeProp): an operand is classified by its shape
against the region's output. A model fx cannot trace as a whole has its children matched one by one. PyTorch's
composite modules (nn.TransformerEncoder ...), which fx keeps as leaves, are first written out as their ops
(templates.expand).

Each kind of region (its TemplateRegion and its anchor finder) is a module of templates.regions, tried in the order
of regions.FINDERS; this module holds what they share: the walk, the elementwise chains, the rewrite and the tracing.

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
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.experimental.meta_tracer import gen_constructor_wrapper
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.expand import expand
from farm_agent.tuner.templates.regions import FINDERS, pointwise
from farm_agent.tuner.templates.regions.attention import AttentionRegion
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, shape_of
from farm_agent.tuner.templates.regions.conv import ConvRegion
from farm_agent.tuner.templates.regions.cross_entropy import CrossEntropyRegion
from farm_agent.tuner.templates.regions.distance import DistanceRegion
from farm_agent.tuner.templates.regions.gather import GatherRegion
from farm_agent.tuner.templates.regions.gemm import GemmRegion
from farm_agent.tuner.templates.regions.pointwise import PointwiseRegion
from farm_agent.tuner.templates.regions.pool import PoolRegion
from farm_agent.tuner.templates.regions.recurrence import RecurrenceRegion
from farm_agent.tuner.templates.regions.rows import RowRegion
from farm_agent.tuner.templates.regions.scan import ScanRegion

__all__ = ["PRECISIONS", "Anchor", "AttentionRegion", "ConvRegion", "CrossEntropyRegion", "DistanceRegion",
           "GatherRegion", "GemmRegion", "Matcher", "PointwiseRegion", "PoolRegion", "RecurrenceRegion", "RowRegion",
           "ScanRegion", "TemplateRegion", "regions", "rewrite"]

PRECISIONS = ("ieee", "tf32x3", "tf32")

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
        """The first region kind's anchor at `node` (regions.FINDERS, in order), or None."""
        if (shape_of(node) is None or dtype_of(node) != torch.float32) and not _fp32_tensors(node):
            return None
        mod = self.module(node)
        try:
            for find in FINDERS:
                anchor = find(self, node, mod)
                if anchor is not None:
                    return anchor
        except (ValueError, TypeError, KeyError, AttributeError, IndexError):
            return None  # a form the templates do not cover (asymmetric padding, ceil_mode ...)
        return None

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
        if not isinstance(other, fx.Node) or dtype_of(other) != torch.float32:
            return None, None
        shape, out = shape_of(other), shape_of(tail)
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
        out = shape_of(tail)
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
            while anchor.chainable:
                gate = _written_silu(tail)
                if gate is not None:  # y * sigmoid(y): one step, its two nodes
                    anchor.chain.append(Step("silu"))
                    chain_nodes.extend(gate)
                    tail = gate[-1]
                    continue
                if len(tail.users) != 1:
                    break
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
            if anchor.worth is not None and not anchor.worth(anchor.chain):
                continue  # left to PyTorch (a bare fp32 GEMM under ieee: regions.gemm)
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
        count += pointwise.fuse(self, count)  # the elementwise graphs no anchored region took
        graph.lint()
        self.gm.recompile()
        return count


# What builds a causal mask (a size read from a shape, ones, a triangle, a complement, a bool): free of side effects
_BUILDER_FUNCTIONS = (torch.ones, torch.triu, torch.tril, operator.getitem, getattr, operator.invert,
                      torch.logical_not)
_BUILDER_METHODS = ("triu", "tril", "bool", "to", "size", "logical_not", "bitwise_not")


def _fp32_tensors(node: fx.Node) -> bool:
    """Whether the node's value is a tuple of fp32 tensors, or of such tuples (torch.var_mean's (variance, mean), an
    LSTM's (output, (h_n, c_n))): a finder may take it as a region of several outputs."""
    def fp32(meta: Any) -> bool:  # a TensorMetadata is a named tuple itself
        if isinstance(meta, TensorMetadata):
            return meta.dtype == torch.float32
        return isinstance(meta, tuple) and bool(meta) and all(fp32(m) for m in meta)
    meta = node.meta.get("tensor_meta")
    return not isinstance(meta, TensorMetadata) and fp32(meta)


def _written_silu(tail: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(sigmoid(y), y * sigmoid(y)) where these are y's only two users and the product alone reads the sigmoid:
    SiLU as models write it out (a swish), which reads y twice and so would end a chain of single users."""
    if len(tail.users) != 2:
        return None
    gate = next((u for u in tail.users if (u.op == "call_function" and ACT_FUNCTIONS.get(u.target) == "sigmoid")
                 or (u.op == "call_method" and u.target == "sigmoid")), None)
    if gate is None or gate.args != (tail,) or gate.kwargs or len(gate.users) != 1:
        return None
    product = next(iter(gate.users))
    mul = BINARY_FUNCTIONS.get(product.target) if product.op == "call_function" else \
        BINARY_METHODS.get(str(product.target)) if product.op == "call_method" else None
    if mul != "mul" or product.kwargs or len(product.args) != 2 or set(product.args) != {tail, gate}:
        return None
    return gate, product


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
    expand(model)
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
