"""Elementwise ops *before* a row op, applied to each element as the row kernel loads it: the scale and the causal
mask of attention scores before their softmax, a bias added before a LayerNorm ...

A prologue is a tuple of items applied in order to the loaded value: epilogue Steps (a number, an activation, a
clamp, or a tensor of the input's own shape read at `offs`) and at most one CausalFill, the `masked_fill` of a
triangular mask. A causal mask is recognised where it is built (torch.ones(...).triu(k) or .tril(k)) rather than
read as a tensor: the kernel knows from a column's and a row's index whether it is filled, so it reads no mask (and
the mask is not built: its nodes leave the graph). The filled elements of the input are still read, though their
value is the fill whatever they hold: a causal softmax that skipped them would move about 3/4 of the bytes of its
input and output, and the evaluator rejects a time under those bytes at the memory bandwidth as work not done.

`reference` is the PyTorch path (the CPU and the tests' oracle); `triton_lines` writes the items as Triton source
for the row kernel, which names the loaded value `acc`, the input's flat offsets `offs`, its load mask `mask`
and the elements not filled `keep`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from farm_agent.tuner.templates import epilogue
from farm_agent.tuner.templates.epilogue import Step

PARTS = ("triu", "tril")


@dataclass(frozen=True)
class CausalFill:
    """x.masked_fill(mask, value), mask = torch.ones(Q, K).triu(diagonal) ("triu") or .tril(diagonal) ("tril")
    over the last two dims of x (broadcast over the leading ones): element (q, k) is filled where k - q >= diagonal
    (triu) or k - q <= diagonal (tril)."""

    part: str
    diagonal: int
    value: float

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise ValueError(f"a causal mask is one of {PARTS}")

    def mask(self, q: int, k: int, device: torch.device) -> torch.Tensor:
        ones = torch.ones(q, k, dtype=torch.bool, device=device)
        return ones.triu(self.diagonal) if self.part == "triu" else ones.tril(self.diagonal)

    @property
    def code(self) -> int:
        """The row kernel's MASK: 1 keeps k < q + diagonal (triu filled), 2 keeps k > q + diagonal (tril filled)."""
        return 1 if self.part == "triu" else 2


Item = Step | CausalFill
Prologue = tuple[Item, ...]


def fill_of(prologue: Sequence[Item]) -> CausalFill | None:
    fills = [i for i in prologue if isinstance(i, CausalFill)]
    if len(fills) > 1:
        raise ValueError("a prologue has at most one causal fill")
    return fills[0] if fills else None


def tensor_steps(prologue: Sequence[Item]) -> list[Step]:
    """The steps that read a tensor (of the input's shape), in the order their tensors are passed."""
    return [i for i in prologue if isinstance(i, Step) and i.takes_tensor]


def check(prologue: Sequence[Item]) -> None:
    fill_of(prologue)
    if any(isinstance(i, Step) and i.operand == "channel" for i in prologue):
        raise ValueError("a prologue's tensors have the input's shape")


def reference(x: torch.Tensor, prologue: Sequence[Item], operands: Sequence[torch.Tensor]) -> torch.Tensor:
    tensors = iter(operands)
    for item in prologue:
        if isinstance(item, CausalFill):
            x = x.masked_fill(item.mask(x.shape[-2], x.shape[-1], x.device), item.value)
        else:
            x = epilogue.reference(x, (item,), [next(tensors)] if item.takes_tensor else [], channel_dim=-1)
    return x


def triton_lines(prologue: Sequence[Item], indent: str) -> tuple[list[str], list[str]]:
    """(kernel parameters P0, P1 ... one per tensor, source lines) applying the prologue to `acc`."""
    params: list[str] = []
    lines: list[str] = []
    for item in prologue:
        if isinstance(item, CausalFill):
            lines.append(f"{indent}acc = tl.where(keep, acc, {epilogue.literal(item.value)})")
            continue
        name = None
        if item.takes_tensor:
            name = f"P{len(params)}"
            params.append(name)
        lines.append(f"{indent}acc = {epilogue.step_expression(item, name)}")
    return params, lines


def describe(prologue: Sequence[Item]) -> str:
    """A short name for reports: "mul[scalar]+fill[triu 1]"."""
    return "+".join(f"fill[{i.part} {i.diagonal}]" if isinstance(i, CausalFill) else epilogue.describe((i,))
                    for i in prologue)
