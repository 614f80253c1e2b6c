"""Scans (templates.scan): torch.cumsum, torch.cumprod along the last dim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from farm_agent.tuner.templates.conv import kernel_operands
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, shape_of
from farm_agent.tuner.templates.scan import ScanKernel, ScanSpec, torch_scan

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


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


def find(matcher: Matcher, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
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
    shape = shape_of(x)
    if shape is None or not shape or dtype_of(x) != torch.float32 or dim % len(shape) != len(shape) - 1:
        return None
    spec = ScanSpec(str(name))

    def make_scan(chain: tuple[Step, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return ScanRegion(spec, chain, sources)

    return Anchor("scan", [x], -1, make_scan)
