"""Embedding lookups (templates.gather): nn.Embedding, F.embedding, torch.embedding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from farm_agent.tuner.templates.conv import kernel_operands
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.gather import ID_DTYPES, GatherKernel
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, shape_of

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


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


def find(matcher: Matcher, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
    """nn.Embedding, F.embedding or torch.embedding of an fp32 [V, D] table by int32 or int64 ids of any shape.
    Not with max_norm (the lookup renormalises the table's rows in place) or sparse gradients (left to PyTorch);
    padding_idx and scale_grad_by_freq change only the gradients, so those lookups are matched."""
    if not (isinstance(mod, nn.Embedding)
            or (node.op == "call_function" and node.target in (F.embedding, torch.embedding))):
        return None
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
    shape = table.shape if isinstance(table, torch.Tensor) else shape_of(table)
    dtype = table.dtype if isinstance(table, torch.Tensor) else dtype_of(table)
    if not isinstance(ids, fx.Node) or dtype_of(ids) not in ID_DTYPES or shape is None or len(shape) != 2 \
            or dtype != torch.float32 or (embedding is None and not isinstance(table, fx.Node)):
        return None

    def make_gather(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return GatherRegion(embedding, options, chain, sources)

    return Anchor("gather", [ids] if embedding is not None else [ids, table], -1, make_gather)
