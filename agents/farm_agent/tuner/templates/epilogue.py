"""Elementwise chains fused into a producer kernel's store: bias, scale, activation, residual, clamp ...

An epilogue is a tuple of Steps applied in order to the producer's fp32 result while it is still in registers, so
that a conv + bias + BatchNorm + SiLU + residual writes its output once and never reads it back. Each step takes
the running value and at most one operand:

    scalar   a Python number baked into the kernel's source
    channel  a vector over the output's channel (a conv's out-channel, a GEMM's column, a norm's feature)
    full     a tensor of the output's own shape (a residual, a gate)

`reference` applies a chain with PyTorch ops (the CPU path and the tests' oracle); `triton_lines` writes the same
chain as Triton source for a template kernel, which names its running value `acc`, its channel index tile `chan`,
its flat output offsets `offs` and its store mask `mask`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# op -> (operand kind or None, PyTorch reference of (value, operand, arg)). arg: a number the step carries.
BINARY = ("add", "sub", "rsub", "mul", "div", "rdiv")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid", "leaky_relu",
               "mish", "softplus", "elu", "neg", "exp", "abs", "square")
OPERAND_KINDS = ("scalar", "channel", "full")


@dataclass(frozen=True)
class Step:
    """One elementwise op of a chain. Binary ops (BINARY) take `operand` (a kind) or, for "scalar", `value`;
    "clamp" takes `lo`/`hi` (None: unbounded); activations take `value` where they have a parameter (leaky_relu's
    slope, elu's alpha)."""

    op: str
    operand: str | None = None  # "scalar" | "channel" | "full" for binary ops
    value: float | None = None
    lo: float | None = None
    hi: float | None = None

    def __post_init__(self) -> None:
        if self.op in BINARY:
            if self.operand not in OPERAND_KINDS:
                raise ValueError(f"{self.op}: operand must be one of {OPERAND_KINDS}")
            if self.operand == "scalar" and self.value is None:
                raise ValueError(f"{self.op}: a scalar operand needs a value")
        elif self.op == "clamp":
            if self.lo is None and self.hi is None:
                raise ValueError("clamp needs lo or hi")
        elif self.op not in ACTIVATIONS:
            raise ValueError(f"unknown epilogue op {self.op!r}")

    @property
    def takes_tensor(self) -> bool:
        return self.op in BINARY and self.operand in ("channel", "full")


Epilogue = tuple[Step, ...]


def tensor_operands(chain: Sequence[Step]) -> list[Step]:
    """The steps that read a tensor, in the order their tensors are passed."""
    return [s for s in chain if s.takes_tensor]


def _activation(y: torch.Tensor, step: Step) -> torch.Tensor:
    op = step.op
    if op == "relu":
        return torch.relu(y)
    if op == "gelu":
        return F.gelu(y)
    if op == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if op == "silu":
        return F.silu(y)
    if op == "sigmoid":
        return torch.sigmoid(y)
    if op == "tanh":
        return torch.tanh(y)
    if op == "hardswish":
        return F.hardswish(y)
    if op == "hardsigmoid":
        return F.hardsigmoid(y)
    if op == "leaky_relu":
        return F.leaky_relu(y, step.value if step.value is not None else 0.01)
    if op == "mish":
        return F.mish(y)
    if op == "softplus":
        return F.softplus(y)
    if op == "elu":
        return F.elu(y, step.value if step.value is not None else 1.0)
    if op == "neg":
        return -y
    if op == "exp":
        return torch.exp(y)
    if op == "abs":
        return torch.abs(y)
    if op == "square":
        return y * y
    raise ValueError(op)


def channel_view(vector: torch.Tensor, out: torch.Tensor, channel_dim: int) -> torch.Tensor:
    """A [C] vector shaped to broadcast along `channel_dim` of `out`."""
    shape = [1] * out.dim()
    shape[channel_dim] = -1
    return vector.reshape(shape)


def reference(y: torch.Tensor, chain: Sequence[Step], operands: Sequence[torch.Tensor], channel_dim: int
              ) -> torch.Tensor:
    """The chain in PyTorch: `operands` are the tensors of tensor_operands(chain), channel vectors as [C]."""
    tensors = iter(operands)
    for step in chain:
        if step.op in BINARY:
            if step.operand == "scalar":
                other: torch.Tensor | float = float(step.value)  # type: ignore[arg-type]
            else:
                other = next(tensors)
                if step.operand == "channel":
                    other = channel_view(other, y, channel_dim)
            y = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "rsub": lambda a, b: b - a,
                 "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "rdiv": lambda a, b: b / a}[step.op](y, other)
        elif step.op == "clamp":
            y = torch.clamp(y, step.lo, step.hi)
        else:
            y = _activation(y, step)
    return y


# --- Triton source ---------------------------------------------------------------------------------------------

_SQRT_HALF = "0.7071067811865476"


def _activation_source(step: Step) -> str:
    op = step.op
    sources = {
        "relu": "tl.maximum(acc, 0.0)",
        "gelu": f"0.5 * acc * (1.0 + tl.math.erf(acc * {_SQRT_HALF}))",
        # tanh(u) = 2 sigmoid(2u) - 1, written with exp so that it needs no libdevice tanh
        "gelu_tanh": "0.5 * acc * (1.0 + (2.0 / (1.0 + tl.exp(-1.5957691216057308 * (acc + 0.044715 * acc * acc"
                     " * acc))) - 1.0))",
        "silu": "acc / (1.0 + tl.exp(-acc))",
        "sigmoid": "1.0 / (1.0 + tl.exp(-acc))",
        "tanh": "2.0 / (1.0 + tl.exp(-2.0 * acc)) - 1.0",
        "hardswish": "acc * tl.minimum(tl.maximum(acc + 3.0, 0.0), 6.0) / 6.0",
        "hardsigmoid": "tl.minimum(tl.maximum(acc + 3.0, 0.0), 6.0) / 6.0",
        "leaky_relu": f"tl.where(acc >= 0.0, acc, acc * {float(step.value if step.value is not None else 0.01)!r})",
        # softplus with PyTorch's threshold (20): x itself above it
        "softplus": "tl.where(acc > 20.0, acc, tl.log(1.0 + tl.exp(tl.minimum(acc, 20.0))))",
        "mish": "acc * (2.0 / (1.0 + tl.exp(-2.0 * tl.where(acc > 20.0, acc, tl.log(1.0 + tl.exp(tl.minimum(acc, "
                "20.0)))))) - 1.0)",
        "elu": f"tl.where(acc > 0.0, acc, {float(step.value if step.value is not None else 1.0)!r} * "
               "(tl.exp(tl.minimum(acc, 0.0)) - 1.0))",
        "neg": "-acc",
        "exp": "tl.exp(acc)",
        "abs": "tl.abs(acc)",
        "square": "acc * acc",
    }
    return sources[op]


def literal(value: float) -> str:
    """A float as Triton source (inf and nan are not Python literals)."""
    value = float(value)
    return repr(value) if math.isfinite(value) else f'float("{value}")'


# A binary step's Triton expression: the running value `acc` and the other operand {o}.
BINARY_SOURCE = {"add": "acc + {o}", "sub": "acc - {o}", "rsub": "{o} - acc", "mul": "acc * {o}", "div": "acc / {o}",
                 "rdiv": "{o} / acc"}


def step_expression(step: Step, operand: str | None = None, hoisted: bool = False) -> str:
    """The new value of `acc` after `step`; `operand`: the pointer parameter of its tensor, read at `chan`
    (channel) or `offs` (full) under `mask` (hoisted: a channel operand is the value `channel_lines` loaded)."""
    if step.op in BINARY:
        if step.operand == "scalar":
            other = literal(step.value)  # type: ignore[arg-type]
        elif hoisted and step.operand == "channel":
            other = f"{operand}_chan"
        else:
            index = "chan" if step.operand == "channel" else "offs"
            other = f"tl.load({operand} + {index}, mask=mask, other=1.0).to(tl.float32)"
        return BINARY_SOURCE[step.op].format(o=other)
    if step.op == "clamp":
        expression = "acc"
        if step.lo is not None:
            expression = f"tl.maximum({expression}, {literal(step.lo)})"
        if step.hi is not None:
            expression = f"tl.minimum({expression}, {literal(step.hi)})"
        return expression
    return _activation_source(step)


def triton_lines(chain: Sequence[Step], indent: str = "    ", hoisted: bool = False) -> tuple[list[str], list[str]]:
    """(kernel parameters, source lines) applying `chain` to `acc`: one pointer parameter E0, E1, ... per tensor
    operand, read at `chan` (channel) or `offs` (full) under `mask`. hoisted: channel operands are the values
    `channel_lines` loaded before the kernel's loop (E0_chan, ...), not a load per stored element."""
    params: list[str] = []
    lines: list[str] = []
    for step in chain:
        name = None
        if step.takes_tensor:
            name = f"E{len(params)}"
            params.append(name)
        lines.append(f"{indent}acc = {step_expression(step, name, hoisted)}")
    return params, lines


def channel_lines(chain: Sequence[Step], mask: str, indent: str = "    ") -> list[str]:
    """The loads of a chain's channel operands into E0_chan, ..., once (a kernel that stores a tile many times, in
    a loop over one axis, keeps its channels fixed: one load a channel, not one a stored element)."""
    names = [f"E{i}" for i, step in enumerate(s for s in chain if s.takes_tensor)]
    kinds = [step.operand for step in chain if step.takes_tensor]
    return [f"{indent}{name}_chan = tl.load({name} + chan, mask={mask}, other=1.0).to(tl.float32)"
            for name, kind in zip(names, kinds, strict=True) if kind == "channel"]


def describe(chain: Sequence[Step]) -> str:
    """A short name for a chain, for reports: "add[channel]+relu"."""
    parts = []
    for s in chain:
        if s.op in BINARY:
            parts.append(f"{s.op}[{s.operand}]")
        else:
            parts.append(s.op)
    return "+".join(parts)
