"""Max and average pooling, 1-D to 3-D (kernel, stride, padding, dilation for max, count_include_pad for average),
with the epilogue chain before the store (`chan`: the channel). Like the convolutions, every pooling runs as a 3-D
one. 2-D and 3-D windows take the streamed form (templates.stream: each input row or plane read once a program);
1-D ones and windows too long for its ring the tile form: one program per block of an output plane
(templates.plane) with the window unrolled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from farm_agent.tuner.templates import codegen, plane, stream
from farm_agent.tuner.templates.epilogue import Step, triton_lines


def _three(values: Sequence[int], fill: int) -> tuple[int, int, int]:
    values = tuple(int(v) for v in values)
    return (fill,) * (3 - len(values)) + values  # type: ignore[return-value]


@dataclass(frozen=True)
class PoolSpec:
    kind: str  # "max" | "avg"
    dims: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    count_include_pad: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("max", "avg") or self.dims not in (1, 2, 3):
            raise ValueError("a pool is max or avg over 1 to 3 dims")
        for name in ("kernel", "stride", "padding", "dilation"):
            if len(getattr(self, name)) != self.dims:
                raise ValueError(f"{name} needs {self.dims} values")
        if any(2 * p > k for p, k in zip(self.padding, self.kernel, strict=True)):
            raise ValueError("padding must be at most half the kernel")
        if self.kind == "avg" and set(self.dilation) != {1}:
            raise ValueError("average pooling has no dilation")

    @classmethod
    def of(cls, module: torch.nn.Module) -> PoolSpec:
        """From nn.{Max,Avg}Pool{1,2,3}d (ceil_mode off, no divisor override, no indices)."""
        name = type(module).__name__
        kind = "max" if name.startswith("Max") else "avg"
        dims = int(name[-2])
        if getattr(module, "ceil_mode", False) or getattr(module, "return_indices", False) \
                or getattr(module, "divisor_override", None):
            raise ValueError("ceil_mode, return_indices and divisor_override are not covered")

        def tup(value: Any, default: int) -> tuple[int, ...]:
            if value is None:
                return (default,) * dims
            return tuple(value) if isinstance(value, (tuple, list)) else (int(value),) * dims

        kernel = tup(module.kernel_size, 1)  # type: ignore[attr-defined]
        stride = tup(module.stride, 1) if module.stride not in (None, [], ()) else kernel  # type: ignore[attr-defined]
        return cls(kind=kind, dims=dims, kernel=kernel, stride=stride, padding=tup(module.padding, 0),  # type: ignore
                   dilation=tup(getattr(module, "dilation", 1), 1),
                   count_include_pad=bool(getattr(module, "count_include_pad", True)))

    def output_shape(self, x_shape: Sequence[int]) -> tuple[int, ...]:
        spatial = x_shape[-self.dims:]
        out = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d
               in zip(spatial, self.kernel, self.stride, self.padding, self.dilation, strict=True)]
        if min(out) < 1:
            raise ValueError("the output would be empty")
        return (*x_shape[:-self.dims], *out)


def torch_pool(x: torch.Tensor, spec: PoolSpec) -> torch.Tensor:
    if spec.kind == "max":
        fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[spec.dims - 1]
        return fn(x, spec.kernel, spec.stride, spec.padding, spec.dilation)
    fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[spec.dims - 1]
    return fn(x, spec.kernel, spec.stride, spec.padding, count_include_pad=spec.count_include_pad)


def window_reference(x: torch.Tensor, spec: PoolSpec) -> torch.Tensor:
    """The kernel's arithmetic in PyTorch: for each tap, the shifted input where it is inside, reduced."""
    out_shape = spec.output_shape(x.shape)
    lead = x.shape[:-spec.dims]
    sizes = _three(x.shape[-spec.dims:], 1)
    outs = _three(out_shape[-spec.dims:], 1)
    k3, s3, p3, d3 = (_three(spec.kernel, 1), _three(spec.stride, 1), _three(spec.padding, 0),
                      _three(spec.dilation, 1))
    x5 = x.reshape(-1, *sizes)
    grids = [torch.arange(o, device=x.device) for o in outs]
    acc = torch.full((x5.shape[0], *outs), -torch.inf if spec.kind == "max" else 0.0, dtype=torch.float64,
                     device=x.device)
    count = torch.zeros(outs, dtype=torch.float64, device=x.device)
    for kd in range(k3[0]):
        for kh in range(k3[1]):
            for kw in range(k3[2]):
                idx, ok = [], []
                for i, k in enumerate((kd, kh, kw)):
                    index = grids[i] * s3[i] - p3[i] + k * d3[i]
                    ok.append((index >= 0) & (index < sizes[i]))
                    idx.append(index.clamp(0, sizes[i] - 1))
                valid = ok[0][:, None, None] & ok[1][None, :, None] & ok[2][None, None, :]
                values = x5[:, idx[0]][:, :, idx[1]][:, :, :, idx[2]].to(torch.float64)
                if spec.kind == "max":
                    acc = torch.maximum(acc, torch.where(valid, values, -torch.inf))
                else:
                    acc = acc + values * valid
                    count = count + (valid if not spec.count_include_pad else torch.ones_like(valid)).to(count.dtype)
    if spec.kind == "avg":
        acc = acc / count
    return acc.reshape(*lead, *out_shape[-spec.dims:]).to(x.dtype)


_SOURCE = """
import triton
import triton.language as tl
{plane_tile}

@triton.jit
def kernel(X, Y, {epi_params}C, D, H, W, OD, OH, OW,
           KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, SD: tl.constexpr, SH: tl.constexpr,
           SW: tl.constexpr, PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, DD: tl.constexpr,
           DH: tl.constexpr, DW: tl.constexpr, IS_MAX: tl.constexpr, INCLUDE_PAD: tl.constexpr,
           BH: tl.constexpr, BW: tl.constexpr):
    plane, od, oh, ow, mask = plane_tile(OD, OH, OW, BH, BW)
    chan = plane % C + tl.zeros((BH, BW), dtype=tl.int32)
    base = X + plane.to(tl.int64) * (D * H * W)
    if IS_MAX:
        acc = tl.full((BH, BW), float("-inf"), dtype=tl.float32)
    else:
        acc = tl.zeros((BH, BW), dtype=tl.float32)
    count = tl.zeros((BH, BW), dtype=tl.float32)
    for kd in tl.static_range(KD):
        id_ = od * SD - PD + kd * DD
        d_ok = (id_ >= 0) & (id_ < D)
        for kh in tl.static_range(KH):
            ih = oh * SH - PH + kh * DH
            h_ok = d_ok & (ih >= 0) & (ih < H)
            for kw in tl.static_range(KW):
                iw = ow * SW - PW + kw * DW
                ok = h_ok & (iw >= 0) & (iw < W)
                if IS_MAX:
                    v = tl.load(base + (id_ * H + ih) * W + iw, mask=mask & ok, other=float("-inf"))
                    acc = tl.maximum(acc, v)
                else:
                    v = tl.load(base + (id_ * H + ih) * W + iw, mask=mask & ok, other=0.0)
                    acc += v
                    count += tl.where(ok, 1.0, 0.0)
    if not IS_MAX:
        if INCLUDE_PAD:
            acc = acc / (KD * KH * KW)
        else:
            acc = acc / count
    offs = plane.to(tl.int64) * (OD * OH * OW) + (od * OH + oh) * OW + ow
{epilogue}
    tl.store(Y + offs, acc, mask=mask)
"""


def streamed(spec: PoolSpec) -> tuple[str, stream.Ring] | None:
    """The streamed form's mode and ring for this pooling (templates.stream), or None for the tile form: a 3-D
    window walks depths ("planes"); a 2-D one, or a 3-D one with no depth window, walks rows ("rows"); a 1-D one
    (one row a plane) and windows longer than a ring keeps take the tile form."""
    k3, s3, p3, d3 = (_three(spec.kernel, 1), _three(spec.stride, 1), _three(spec.padding, 0),
                      _three(spec.dilation, 1))
    if k3[0] > 1:
        mode, ring = "planes", stream.Ring(k3[0], s3[0], p3[0], d3[0])
    elif s3[0] == 1 and p3[0] == 0 and k3[1] > 1:
        mode, ring = "rows", stream.Ring(k3[1], s3[1], p3[1], d3[1])
    else:
        return None
    return (mode, ring) if ring.span <= stream.MAX_SPAN else None


class PoolKernel:
    def __init__(self, spec: PoolSpec, chain: tuple[Step, ...]) -> None:
        self.spec, self.chain = spec, chain
        self.streamed = streamed(spec)
        self._kernel: Any = None

    def _build(self, oh: int, ow: int) -> Any:
        spec = self.spec
        if self.streamed is None:
            params, lines = triton_lines(self.chain)
            module = codegen.load_source(_SOURCE.format(epi_params="".join(f"{p}, " for p in params),
                                                        epilogue="\n".join(lines), plane_tile=plane.PLANE_TILE), "pool")
            return codegen.autotuned(module.kernel, plane.configs(oh, ow), ["OD", "OH", "OW"])
        mode, ring = self.streamed
        divisor = math.prod(spec.kernel) if spec.count_include_pad else None
        module = codegen.load_source(stream.pool_source(mode, ring, spec.kind == "max", divisor, self.chain),
                                     f"pool_{mode}")
        return codegen.autotuned(module.kernel, stream.configs(mode, oh, ow), ["PLANES", "OD", "OH", "OW"])

    def __call__(self, x: torch.Tensor, operands: Sequence[torch.Tensor]) -> torch.Tensor:
        spec = self.spec
        out_shape = spec.output_shape(x.shape)
        d, h, w = _three(x.shape[-spec.dims:], 1)
        od, oh, ow = _three(out_shape[-spec.dims:], 1)
        if self._kernel is None:
            self._kernel = self._build(oh, ow)
        x = x.contiguous()
        y = torch.empty(out_shape, device=x.device, dtype=torch.float32)
        channels = x.shape[-spec.dims - 1] if x.dim() > spec.dims else 1
        planes = x.numel() // (d * h * w)
        k3, s3, p3, d3 = (_three(spec.kernel, 1), _three(spec.stride, 1), _three(spec.padding, 0),
                          _three(spec.dilation, 1))
        if self.streamed is None:
            self._kernel[plane.grid(planes, od, oh, ow)](
                x, y, *operands, channels, d, h, w, od, oh, ow, KD=k3[0], KH=k3[1], KW=k3[2], SD=s3[0], SH=s3[1],
                SW=s3[2], PD=p3[0], PH=p3[1], PW=p3[2], DD=d3[0], DH=d3[1], DW=d3[2], IS_MAX=spec.kind == "max",
                INCLUDE_PAD=spec.count_include_pad)
            return y
        mode, _ = self.streamed
        if mode == "rows":  # a depth without a window is more planes
            planes, od = planes * d, 1
        self._kernel[stream.grid(mode, planes, od if mode == "planes" else oh, oh, ow)](
            x, y, *operands, channels, planes, d, h, w, od, oh, ow, KH=k3[1], KW=k3[2], SH=s3[1], SW=s3[2],
            PH=p3[1], PW=p3[2], DH=d3[1], DW=d3[2])
        return y
