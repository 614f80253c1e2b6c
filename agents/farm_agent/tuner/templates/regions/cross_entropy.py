"""Cross-entropy losses (templates.rowreduce's cross_entropy row op): F.cross_entropy, nn.CrossEntropyLoss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from farm_agent.tuner.templates.conv import kernel_operands
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, shape_of
from farm_agent.tuner.templates.rowreduce import RowKernel, RowSpec

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


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


def find(matcher: Matcher, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
    """F.cross_entropy / nn.CrossEntropyLoss of [N, C] fp32 logits and int64 class indices, without class weights
    or label smoothing (any ignore_index; reduction mean, sum or none)."""
    if not (isinstance(mod, nn.CrossEntropyLoss) or (node.op == "call_function" and node.target is F.cross_entropy)):
        return None
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
    shape, target_shape = shape_of(logits), shape_of(targets)
    if reduction not in ("mean", "sum", "none") or not isinstance(ignore, int) or shape is None \
            or len(shape) != 2 or target_shape != shape[:1] or dtype_of(logits) != torch.float32 \
            or dtype_of(targets) != torch.int64:
        return None
    spec = RowSpec("cross_entropy", ignore_index=ignore)

    def make_loss(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return CrossEntropyRegion(spec, reduction, chain, sources)

    return Anchor("rows", [logits, targets], 0, make_loss, allows_channel=False, chainable=reduction == "none")
