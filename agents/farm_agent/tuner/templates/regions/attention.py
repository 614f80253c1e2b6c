"""Attention (templates.attention): F.scaled_dot_product_attention, with tensor-core products only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from farm_agent.tuner.templates.attention import AttentionKernel, head_dims_covered, torch_attention
from farm_agent.tuner.templates.conv import kernel_operands
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, shape_of

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


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


def find(matcher: Matcher, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
    """F.scaled_dot_product_attention of fp32 q [..., Lq, D], k [..., Lk, D], v [..., Lk, DV] (head dims powers
    of two from 16 to 128) without attn_mask, dropout or enable_gqa, causal or not, at the tensor-core precisions
    only: with fp32 FMA the template does the same arithmetic as PyTorch's own fp32 attention kernels and is
    unlikely to beat them (as a bare fp32 GEMM is left to cuBLAS), while split-TF32 products run on the tensor
    cores, past the fp32 CUDA-core peak those kernels are bound by."""
    if node.op != "call_function" or node.target is not F.scaled_dot_product_attention or matcher.precision == "ieee":
        return None
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    args = dict(zip(names, node.args, strict=False)) | dict(node.kwargs)
    q, k, v = args.get("query"), args.get("key"), args.get("value")
    causal, scale = args.get("is_causal", False), args.get("scale")
    if not all(isinstance(t, fx.Node) for t in (q, k, v)) or args.get("attn_mask") is not None \
            or args.get("dropout_p", 0.0) != 0.0 or args.get("enable_gqa", False) or not isinstance(causal, bool) \
            or not (scale is None or (isinstance(scale, (int, float)) and not isinstance(scale, bool))):
        return None
    shapes = [shape_of(t) for t in (q, k, v)]
    if any(s is None or len(s) < 2 for s in shapes) or {dtype_of(t) for t in (q, k, v)} != {torch.float32}:
        return None
    (sq, sk, sv), precision = shapes, matcher.precision
    if sq[-1] != sk[-1] or sk[-2] != sv[-2] or not head_dims_covered(sq[-1], sv[-1]) or 0 in (sq[-2], sk[-2]):
        return None
    try:
        torch.broadcast_shapes(sq[:-2], sk[:-2], sv[:-2])
    except RuntimeError:  # batch dims that do not broadcast
        return None

    def make_attention(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return AttentionRegion(causal, None if scale is None else float(scale), chain, sources, precision)

    return Anchor("attention", [q, k, v], -1, make_attention)  # type: ignore[list-item]
