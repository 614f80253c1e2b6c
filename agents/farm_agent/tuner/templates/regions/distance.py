"""Pairwise distances (templates.gemm's distance form): torch.cdist, p = 2, where PyTorch takes its matrix form."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from farm_agent.tuner.templates.conv import kernel_operands
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.gemm import GemmKernel
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, shape_of

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


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


def find(matcher: Matcher, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
    """torch.cdist(x, y, p=2) where PyTorch itself takes its matrix form (the same arithmetic as the template;
    where it computes the differences directly, near-equal rows keep more digits than a product form can)."""
    if node.op != "call_function" or node.target is not torch.cdist:
        return None
    args = dict(zip(("x1", "x2", "p", "compute_mode"), node.args, strict=False)) | dict(node.kwargs)
    x, y = args.get("x1"), args.get("x2")
    mode = args.get("compute_mode") or "use_mm_for_euclid_dist_if_necessary"
    if not isinstance(x, fx.Node) or not isinstance(y, fx.Node) or float(args.get("p", 2.0)) != 2.0:
        return None
    sx, sy = shape_of(x), shape_of(y)
    if sx is None or sy is None or len(sx) < 2 or len(sy) < 2 or {dtype_of(x), dtype_of(y)} != {torch.float32}:
        return None
    if mode == "donot_use_mm_for_euclid_dist" or (mode == "use_mm_for_euclid_dist_if_necessary"
                                                   and sx[-2] <= 25 and sy[-2] <= 25):
        return None
    precision = matcher.precision

    def make_distance(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return DistanceRegion(chain, sources, precision)

    return Anchor("distance", [x, y], -1, make_distance)
