"""Row ops (templates.rowreduce): softmax, log-softmax, logsumexp, sum, mean (adaptive average pools to 1 too), amax,
torch.var_mean, LayerNorm, RMSNorm (the module, or written out), GroupNorm and F.normalize, each with the elementwise
prologue before it (templates.prologue: what only it reads, a causal masked_fill included) and the chain after it."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from farm_agent.tuner.templates.conv import kernel_operands
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.prologue import CausalFill, Item, Prologue, tensor_steps
from farm_agent.tuner.templates.prologue import describe as describe_prologue
from farm_agent.tuner.templates.prologue import reference as prologue_reference
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, shape_of
from farm_agent.tuner.templates.rowreduce import ROW_OUTPUT, RowKernel, RowSpec, torch_rows

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


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


def find(matcher: Matcher, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
    """The row op at `node` (a module, a function or a method), with the prologue only it reads; or an RMSNorm
    written out, anchored on its mean."""
    x = node.args[0] if node.args else None
    if not isinstance(x, fx.Node):
        return None
    shape = shape_of(x)
    if shape is None or dtype_of(x) != torch.float32 or not shape:
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
        spec, channel_dim = _row_call(node, ndim)
        written = _rms_written_out(node, spec)
        if written is not None:
            return written
    if spec is None:
        return None
    if spec.op in ROW_OUTPUT:
        out_nd = len(spec.output_shape(shape))
        if out_nd == 0:
            return None
        channel_dim = out_nd - 1 if not spec.keepdim else ndim - spec.reduced - 1
        if channel_dim < 0:
            return None
    start, prologue, absorbed, pro_operands, builders = _prologue(matcher, x, spec)
    row_spec, row_norm, cd = spec, norm, channel_dim

    def make_rows(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return RowRegion(row_spec, row_norm, chain, sources, cd, prologue)

    # a multi-dim LayerNorm's feature index spans several dims: a per-channel operand would not be one vector
    allows = not (spec.op in ("layer_norm", "rms_norm") and spec.reduced > 1)
    return Anchor("rows", [start, *pro_operands], channel_dim, make_rows, allows_channel=allows,
                  absorbed=absorbed, builders=builders, chainable=spec.op != "var_mean")  # var_mean: a tuple


def _rms_written_out(mean: fx.Node, spec: RowSpec | None) -> Anchor | None:
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
            or shape_of(product) != shape_of(x):
        return None
    rms = RowSpec("rms_norm", eps=float(eps))

    def make_rms(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return RowRegion(rms, None, chain, sources, -1)

    return Anchor("rows", [x], -1, make_rms, absorbed=[root, added, mean, square], end=product)


def _prologue(matcher: Matcher, x: fx.Node, spec: RowSpec
              ) -> tuple[fx.Node, Prologue, list[fx.Node], list[fx.Node], list[fx.Node]]:
    """The elementwise ops before a row op that only it reads, walking back from its input while each node is
    its successor's only input of the input's shape: numbers, activations, clamps, tensors of the input's shape
    and one causal masked_fill (rows along the last dim only). Returns (the region's input, the prologue, its
    nodes nearest the anchor first, its tensors, the nodes that built its mask)."""
    shape = shape_of(x)
    items: list[Item] = []
    absorbed: list[fx.Node] = []
    operands: list[fx.Node] = []
    builders: list[fx.Node] = []
    stub = Anchor("rows", [], -1, lambda chain, sources: None,  # type: ignore[arg-type,return-value]
                  allows_channel=False)  # what matcher.step needs to know: no per-channel operands
    causal_ok = spec.reduced == 1 and spec.op != "group_norm" and shape is not None and len(shape) >= 2
    node = x
    while len(node.users) == 1 and node.op in ("call_function", "call_method", "call_module") \
            and shape_of(node) == shape and dtype_of(node) == torch.float32:
        fill = _causal_fill(node, shape) if causal_ok and not builders else None  # type: ignore[arg-type]
        if fill is not None:
            item, source, made = fill
            builders.extend(made)
        else:
            source = next((a for a in node.args if isinstance(a, fx.Node) and shape_of(a) == shape
                           and dtype_of(a) == torch.float32), None)
            if source is None:
                break
            item, operand = matcher.step(node, source, stub)
            if item is None or isinstance(operand, nn.Module):
                break
            if operand is not None:
                operands.append(operand)
        items.append(item)
        absorbed.append(node)
        node = source
    return node, tuple(reversed(items)), absorbed, operands[::-1], builders


def _causal_fill(node: fx.Node, shape: tuple[int, ...]
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
    mask_shape = shape_of(mask)
    if mask_shape is None or dtype_of(mask) != torch.bool or mask_shape[-2:] != shape[-2:] \
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


def _row_call(node: fx.Node, ndim: int) -> tuple[RowSpec | None, int]:
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
    if node.op not in ("call_function", "call_method") or not isinstance(name, str):
        return None, -1
    normalize = _normalize_call(node, ndim)
    if normalize is not None:
        return normalize, -1
    if node.op == "call_function" and node.target is torch.var_mean:
        return _var_mean_call(node, ndim), -1
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


def _var_mean_call(node: fx.Node, ndim: int) -> RowSpec | None:
    """torch.var_mean(x, dim, [unbiased,] keepdim=..., correction=...) over trailing dims (numbers, not nodes)."""
    args = dict(zip(("input", "dim", "unbiased", "keepdim"), node.args, strict=False)) | dict(node.kwargs)
    args.pop("input", None)
    dims = _dim_list(args.pop("dim", None), ndim)
    unbiased, correction = args.pop("unbiased", None), args.pop("correction", None)
    keepdim = args.pop("keepdim", False)
    if args or dims is None or dims != list(range(ndim - len(dims), ndim)) or not isinstance(keepdim, bool) \
            or any(v is not None and (isinstance(v, fx.Node) or not isinstance(v, (bool, int))) for v in
                   (unbiased, correction)) or (unbiased is not None and correction is not None):
        return None
    corr = int(correction) if correction is not None else (0 if unbiased is False else 1)
    return RowSpec("var_mean", reduced=len(dims), keepdim=keepdim, correction=corr)


def _normalize_call(node: fx.Node, ndim: int) -> RowSpec | None:
    """F.normalize(x, p=2, dim=<the last>, eps) (a function call; p and dim as numbers)."""
    if node.op != "call_function" or node.target is not F.normalize:
        return None
    args = dict(zip(("input", "p", "dim", "eps"), node.args, strict=False)) | dict(node.kwargs)
    p, dim, eps = args.pop("p", 2.0), args.pop("dim", 1), args.pop("eps", 1e-12)
    if args.pop("out", None) is not None or set(args) != {"input"} or p != 2 or not isinstance(dim, int) \
            or dim % ndim != ndim - 1 or isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None
    return RowSpec("normalize", eps=float(eps))


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


def _ints(value: Any, n: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (int(value),) * n


def _dim_list(value: Any, ndim: int) -> list[int] | None:
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, int) for v in value):
        return None
    return sorted(v % ndim for v in value)

