"""Convolution and transposed convolution (1-D, 2-D, 3-D; stride, padding, dilation, groups) as implicit GEMM.

Every convolution is handled as a 3-D one (missing leading spatial dims have size 1). The GEMM view: rows are the
output pixels (N * OD * OH * OW), columns a group's output channels, the reduction runs over taps and a group's
input channels. The weight is laid out once as [groups, taps, in-channels, out-channels] so that a tile of it is
one coalesced load; the input tile is gathered per tap (no im2col buffer): for a convolution the input coordinate
of output o at tap k is o*s - p + k*d; for a transposed one (its gather form) it is (o + p - k*d) / s where that
divides and lands inside the input. `gather_reference` computes exactly that in PyTorch, which the tests hold
against F.conv*; the Triton kernel does the same arithmetic on tiles, with the epilogue chain before its store.

A strided transposed convolution runs phase by phase instead: the outputs o = q*s + r of one phase r meet only the
taps k = k0 + j*(s/g) (g = gcd(s, d); every s-th tap at dilation 1), at inputs j*(d/g) apart, so each phase is a
dense convolution and no multiply is spent on taps that miss (the gather form would waste s^dims - 1 of every
s^dims: 75% for a 2-D stride 2); a phase no tap reaches (r + p not a multiple of g) gets the epilogue alone.

Groups with few input channels per group (depthwise and the like, where a dot of 16-wide tiles would mostly multiply
zeros) get the direct kernel instead: for 2-D ones with stride and dilation 1 along rows (depthwise 3x3 and the
like), the streamed form (templates.stream: each input row read once a program and added into the output rows it
reaches); otherwise one program per block of an output plane (templates.plane), a loop over the taps with the
tap's weight a scalar.

precision: "ieee" (fp32 FMA: exact fp32), "tf32x3" (split-TF32 on tensor cores: three TF32 products that carry the
low bits too, fp32-level error), "tf32" (one TF32 product: lowers precision).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from farm_agent.tuner.templates import codegen, plane, stream
from farm_agent.tuner.templates.epilogue import Step, tensor_operands, triton_lines

PRECISIONS = ("ieee", "tf32x3", "tf32")


def _three(values: Sequence[int], fill: int) -> tuple[int, int, int]:
    values = tuple(int(v) for v in values)
    return (fill,) * (3 - len(values)) + values  # type: ignore[return-value]


@dataclass(frozen=True)
class ConvSpec:
    """A convolution's parameters, as nn.ConvNd / nn.ConvTransposeNd hold them (tuples of `dims` ints)."""

    dims: int
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1
    transposed: bool = False
    output_padding: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.dims not in (1, 2, 3):
            raise ValueError("dims must be 1, 2 or 3")
        for name in ("stride", "padding", "dilation"):
            if len(getattr(self, name)) != self.dims:
                raise ValueError(f"{name} needs {self.dims} values")
        if self.groups < 1 or min(self.stride) < 1 or min(self.dilation) < 1 or min(self.padding) < 0:
            raise ValueError("groups, stride and dilation must be positive, padding non-negative")

    @property
    def out_pad(self) -> tuple[int, ...]:
        return self.output_padding or (0,) * self.dims

    @classmethod
    def of(cls, module: torch.nn.Module) -> ConvSpec:
        """The spec of an nn.Conv{1,2,3}d or nn.ConvTranspose{1,2,3}d (zero padding only; 'same'/'valid' resolved)."""
        conv = module
        dims = len(conv.kernel_size)  # type: ignore[arg-type]
        if getattr(conv, "padding_mode", "zeros") != "zeros":
            raise ValueError("only zero padding")
        padding = conv.padding  # type: ignore[assignment]
        if isinstance(padding, str):
            if padding == "valid":
                padding = (0,) * dims
            else:  # 'same' (stride 1): PyTorch pads the left by total // 2 and the right by the rest
                totals = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size, strict=True)]  # type: ignore
                if any(t % 2 for t in totals):
                    raise ValueError("'same' padding with an odd total is asymmetric")
                padding = tuple(t // 2 for t in totals)
        transposed = isinstance(conv, torch.nn.modules.conv._ConvTransposeNd)
        return cls(dims=dims, stride=tuple(conv.stride), padding=tuple(padding),  # type: ignore[arg-type]
                   dilation=tuple(conv.dilation), groups=int(conv.groups),  # type: ignore[arg-type]
                   transposed=transposed,
                   output_padding=tuple(conv.output_padding) if transposed else ())  # type: ignore[arg-type]

    def output_shape(self, x_shape: Sequence[int], w_shape: Sequence[int]) -> tuple[int, ...]:
        """[N, C_out, *spatial] of this convolution of an input x_shape with a weight w_shape."""
        n, c_in, *spatial = x_shape
        kernel = w_shape[2:]
        if len(spatial) != self.dims or len(kernel) != self.dims:
            raise ValueError(f"a {self.dims}-d convolution needs a {self.dims + 2}-d input and weight")
        if self.transposed:
            if w_shape[0] != c_in:
                raise ValueError(f"weight has {w_shape[0]} input channels, input {c_in}")
            c_out = w_shape[1] * self.groups
            out = [(size - 1) * s - 2 * p + d * (k - 1) + op + 1 for size, s, p, d, k, op
                   in zip(spatial, self.stride, self.padding, self.dilation, kernel, self.out_pad, strict=True)]
        else:
            if w_shape[1] * self.groups != c_in:
                raise ValueError(f"weight expects {w_shape[1] * self.groups} input channels, input has {c_in}")
            c_out = w_shape[0]
            out = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, s, p, d, k
                   in zip(spatial, self.stride, self.padding, self.dilation, kernel, strict=True)]
        if min(out) < 1:
            raise ValueError("the output would be empty")
        return (n, c_out, *out)

    def flops(self, x_shape: Sequence[int], w_shape: Sequence[int]) -> int:
        """Multiply-adds of the direct definition, times two (what FlopCounterMode counts)."""
        out = self.output_shape(x_shape, w_shape)
        taps = math.prod(w_shape[2:])
        if self.transposed:  # each input element meets each tap once
            return 2 * x_shape[0] * x_shape[1] * math.prod(x_shape[2:]) * taps * (out[1] // self.groups)
        return 2 * math.prod(out) * (x_shape[1] // self.groups) * taps

    def three(self) -> dict[str, tuple[int, int, int]]:
        return {"stride": _three(self.stride, 1), "padding": _three(self.padding, 0),
                "dilation": _three(self.dilation, 1)}


def packed_weight(weight: torch.Tensor, spec: ConvSpec, k_major: bool = False) -> torch.Tensor:
    """[groups, taps, in-channels per group, out-channels per group], contiguous: the kernel's B operand; k_major:
    [groups, taps, out, in] instead, each output channel's inputs contiguous (the layout tensor-core products read
    without a transposing store: see ConvKernel)."""
    g = spec.groups
    taps = math.prod(weight.shape[2:])
    if spec.transposed:  # [C_in, C_out / g, *k]
        c_in, cog = weight.shape[0], weight.shape[1]
        packed = weight.reshape(g, c_in // g, cog, taps).permute(0, 3, 1, 2)
    else:
        c_out, cg = weight.shape[0], weight.shape[1]
        packed = weight.reshape(g, c_out // g, cg, taps).permute(0, 3, 2, 1)
    return (packed.transpose(2, 3) if k_major else packed).contiguous()


def source_coords(out_index: torch.Tensor, tap: int, size: int, stride: int, padding: int, dilation: int,
                  transposed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(input coordinate, valid) of output coordinates `out_index` at tap `tap` along one spatial dim."""
    if transposed:
        num = out_index + padding - tap * dilation
        index = torch.div(num, stride, rounding_mode="floor")
        valid = (num >= 0) & (num % stride == 0) & (index < size)
    else:
        index = out_index * stride - padding + tap * dilation
        valid = (index >= 0) & (index < size)
    return index.clamp(0, size - 1), valid


def gather_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, spec: ConvSpec
                     ) -> torch.Tensor:
    """The implicit GEMM of the kernel, in PyTorch: per tap, gather the input at source_coords and multiply by that
    tap's packed weight slice. Equal to F.conv*d / F.conv_transpose*d (the tests check it)."""
    out_shape = spec.output_shape(x.shape, weight.shape)
    n, c_in = x.shape[:2]
    g = spec.groups
    cg = c_in // g
    x5 = x.reshape(n, c_in, *_three(x.shape[2:], 1)).reshape(n, g, cg, *_three(x.shape[2:], 1))
    sizes = _three(x.shape[2:], 1)
    outs = _three(out_shape[2:], 1)
    kernel = _three(weight.shape[2:], 1)
    packed = packed_weight(weight, spec).to(torch.float64)  # [g, taps, cg, cog]
    cog = packed.shape[-1]
    p3 = spec.three()
    grids = [torch.arange(o, device=x.device) for o in outs]
    acc = torch.zeros(n, g, cog, *outs, dtype=torch.float64, device=x.device)
    tap = 0
    for kd in range(kernel[0]):
        for kh in range(kernel[1]):
            for kw in range(kernel[2]):
                coords = [source_coords(grids[i], k, sizes[i], p3["stride"][i], p3["padding"][i],
                                        p3["dilation"][i], spec.transposed) for i, k in enumerate((kd, kh, kw))]
                (di, dv), (hi, hv), (wi, wv) = coords
                valid = dv[:, None, None] & hv[None, :, None] & wv[None, None, :]
                patch = x5[:, :, :, di][:, :, :, :, hi][:, :, :, :, :, wi].to(torch.float64) * valid
                acc += torch.einsum("ngcdhw,gco->ngodhw", patch, packed[:, tap])
                tap += 1
    y = acc.reshape(n, g * cog, *outs).reshape(out_shape)
    if bias is not None:
        y = y + bias.to(torch.float64).reshape(1, -1, *([1] * spec.dims))
    return y.to(x.dtype)


def torch_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, spec: ConvSpec) -> torch.Tensor:
    fn = {(False, 1): F.conv1d, (False, 2): F.conv2d, (False, 3): F.conv3d, (True, 1): F.conv_transpose1d,
          (True, 2): F.conv_transpose2d, (True, 3): F.conv_transpose3d}[(spec.transposed, spec.dims)]
    if spec.transposed:
        return fn(x, weight, bias, spec.stride, spec.padding, spec.out_pad, spec.groups, spec.dilation)
    return fn(x, weight, bias, spec.stride, spec.padding, spec.dilation, spec.groups)


# --- Triton ------------------------------------------------------------------------------------------------------

_COORDS = '''
        if TRANSPOSED:
            nd = od + PD - kd * DD
            nh = oh + PH - kh * DH
            nw = ow + PW - kw * DW
            id_ = nd // SD
            ih = nh // SH
            iw = nw // SW
            ok = ((nd >= 0) & (nd - id_ * SD == 0) & (id_ < D) & (nh >= 0) & (nh - ih * SH == 0) & (ih < H)
                  & (nw >= 0) & (nw - iw * SW == 0) & (iw < W))
        else:
            id_ = od * SD - PD + kd * DD
            ih = oh * SH - PH + kh * DH
            iw = ow * SW - PW + kw * DW
            ok = (id_ >= 0) & (id_ < D) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
'''

# Shared by the two implicit-GEMM forms (the gather form and the phase form differ only in which taps and inputs
# they visit): one step of the reduction, and the output tile's channels, offsets and mask.
_GEMM_HELPERS = """
@triton.jit
def channel_step(acc, x_rows, spatial, ok, Wp, w_tap, c0, rk, rn, n_ok, CG, COG, DHW, PRECISION: tl.constexpr,
                 B_K_MAJOR: tl.constexpr):
    # acc plus one tap's product over the input channels c0 + rk: the input gathered at `spatial` where `ok`,
    # times the packed weight of tap `w_tap` (groups x taps), [CG, COG] or, B_K_MAJOR, [COG, CG]
    c = c0 + rk
    c_ok = c < CG
    a = tl.load(x_rows[:, None] + spatial[:, None] + c[None, :].to(tl.int64) * DHW, mask=ok[:, None] & c_ok[None, :],
                other=0.0)
    if B_K_MAJOR:
        b_ptrs = Wp + (w_tap * COG + rn)[None, :] * CG + c[:, None]
    else:
        b_ptrs = Wp + (w_tap * CG + c)[:, None] * COG + rn[None, :]
    b = tl.load(b_ptrs, mask=c_ok[:, None] & n_ok[None, :], other=0.0)
    return tl.dot(a, b, acc=acc, input_precision=PRECISION)


@triton.jit
def output_tile(nb, od, oh, ow, g, rn, m_ok, n_ok, CO, COG, OD, OH, OW):
    # (channel, flat offsets, mask) of a tile whose rows are output pixels and columns channels g * COG + rn
    ODHW = OD * OH * OW
    co = g * COG + rn
    offs = (nb.to(tl.int64) * CO * ODHW + (od * OH + oh) * OW + ow)[:, None] + (co.to(tl.int64) * ODHW)[None, :]
    return co[None, :], offs, m_ok[:, None] & n_ok[None, :]
"""

# The reduction over (tap, channel block) is one flat loop, not a loop of loops: Triton's software pipeliner then
# overlaps the next step's loads with this step's dot across taps too (Inductor's convolution template does the same).
_GEMM_SOURCE = """
import triton
import triton.language as tl
{helpers}

@triton.jit
def kernel(X, Wp, Y, {epi_params}M, C_IN, D, H, W, CO, OD, OH, OW, CG, COG,
           SD: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PD: tl.constexpr, PH: tl.constexpr,
           PW: tl.constexpr, DD: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr, KD: tl.constexpr,
           KH: tl.constexpr, KW: tl.constexpr, TRANSPOSED: tl.constexpr, PRECISION: tl.constexpr,
           B_K_MAJOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    g = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < M
    ow = rm % OW
    t = rm // OW
    oh = t % OH
    t = t // OH
    od = t % OD
    nb = t // OD
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < COG
    rk = tl.arange(0, BLOCK_K)
    DHW = D * H * W
    x_rows = X + (nb * C_IN + g * CG).to(tl.int64) * DHW
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    TAPS: tl.constexpr = KD * KH * KW
    KSTEPS = tl.cdiv(CG, BLOCK_K)
    for step in range(TAPS * KSTEPS):
        tap = step // KSTEPS
        c0 = (step - tap * KSTEPS) * BLOCK_K
        kd = tap // (KH * KW)
        kh = (tap // KW) % KH
        kw = tap % KW
{coords}
        acc = channel_step(acc, x_rows, (id_ * H + ih) * W + iw, ok & m_ok, Wp, g * TAPS + tap, c0, rk, rn, n_ok,
                           CG, COG, DHW, PRECISION, B_K_MAJOR)
    chan, offs, mask = output_tile(nb, od, oh, ow, g, rn, m_ok, n_ok, CO, COG, OD, OH, OW)
{epilogue}
    tl.store(Y + offs, acc, mask=mask)
"""

# One program per output plane (batch x channel) and BH x BW block of one output depth (templates.plane): no
# per-element index division, and each tap's loads are a shifted tile of the plane that the caches serve.
_DIRECT_SOURCE = """
import triton
import triton.language as tl
{plane_tile}

@triton.jit
def kernel(X, Wt, Y, {epi_params}C_IN, D, H, W, CO, OD, OH, OW, CG, COG,
           SD: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PD: tl.constexpr, PH: tl.constexpr,
           PW: tl.constexpr, DD: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr, KD: tl.constexpr,
           KH: tl.constexpr, KW: tl.constexpr, TRANSPOSED: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr):
    plane, od, oh, ow, mask = plane_tile(OD, OH, OW, BH, BW)
    co = plane % CO
    nb = plane // CO
    g = co // COG
    chan = co + tl.zeros((BH, BW), dtype=tl.int32)
    DHW = D * H * W
    x_plane = X + (nb * C_IN + g * CG).to(tl.int64) * DHW
    TAPS: tl.constexpr = KD * KH * KW
    acc = tl.zeros((BH, BW), dtype=tl.float32)
    for tap in tl.static_range(TAPS):
        kd = tap // (KH * KW)
        kh = (tap // KW) % KH
        kw = tap % KW
{coords}
        ok = ok & mask
        x_at = x_plane + (id_ * H + ih) * W + iw
        for c in range(0, CG):
            xv = tl.load(x_at + c * DHW, mask=ok, other=0.0)
            if TRANSPOSED:  # weight [C_IN, COG, taps]
                wv = tl.load(Wt + ((g * CG + c) * COG + (co - g * COG)) * TAPS + tap)
            else:  # weight [CO, CG, taps]
                wv = tl.load(Wt + (co * CG + c) * TAPS + tap)
            acc += xv * wv
    offs = plane.to(tl.int64) * (OD * OH * OW) + (od * OH + oh) * OW + ow
{epilogue}
    tl.store(Y + offs, acc, mask=mask)
"""

_PHASED_SOURCE = """
import triton
import triton.language as tl
{helpers}

@triton.jit
def kernel(X, Wp, Y, {epi_params}M, C_IN, D, H, W, CO, OD, OH, OW, QD, QH, QW, CG, COG,
           SD: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PD: tl.constexpr, PH: tl.constexpr,
           PW: tl.constexpr, DD: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr, KD: tl.constexpr,
           KH: tl.constexpr, KW: tl.constexpr, GD: tl.constexpr, GH: tl.constexpr, GW: tl.constexpr,
           ID: tl.constexpr, IH: tl.constexpr, IW: tl.constexpr, PRECISION: tl.constexpr,
           B_K_MAJOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One output phase r per program (o = q * s + r): it meets only the taps k = k0 + j * s/g (g = gcd(s, d), G*
    # here; k0 = ((r + p) / g * I) mod s/g, I the inverse of d/g mod s/g, where g divides r + p; none elsewhere), at
    # input q + (r + p - k0 * d) / s - j * d/g (phase_plan, in Python, is the same arithmetic).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_z = tl.program_id(2)
    PHASES: tl.constexpr = SD * SH * SW
    TAPS: tl.constexpr = KD * KH * KW
    g = pid_z // PHASES
    ph = pid_z % PHASES
    rd = ph // (SH * SW)
    rh = (ph // SW) % SH
    rw = ph % SW
    k0d = (rd + PD) // GD * ID % (SD // GD)
    k0h = (rh + PH) // GH * IH % (SH // GH)
    k0w = (rw + PW) // GW * IW % (SW // GW)
    bd = (rd + PD - k0d * DD) // SD  # exact where a tap reaches the phase (and unused where none does)
    bh = (rh + PH - k0h * DH) // SH
    bw = (rw + PW - k0w * DW) // SW
    # the taps that reach this phase, per dim
    td = (KD - k0d + SD // GD - 1) // (SD // GD) * ((rd + PD) % GD == 0).to(tl.int32)
    th = (KH - k0h + SH // GH - 1) // (SH // GH) * ((rh + PH) % GH == 0).to(tl.int32)
    tw = (KW - k0w + SW // GW - 1) // (SW // GW) * ((rw + PW) % GW == 0).to(tl.int32)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    qw = rm % QW
    t = rm // QW
    qh = t % QH
    t = t // QH
    qd = t % QD
    nb = t // QD
    od = qd * SD + rd
    oh = qh * SH + rh
    ow = qw * SW + rw
    m_ok = (rm < M) & (od < OD) & (oh < OH) & (ow < OW)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < COG
    rk = tl.arange(0, BLOCK_K)
    DHW = D * H * W
    x_rows = X + (nb * C_IN + g * CG).to(tl.int64) * DHW
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    KSTEPS = tl.cdiv(CG, BLOCK_K)
    for step in range(td * th * tw * KSTEPS):  # one flat loop, as in the gather form
        j = step // KSTEPS
        c0 = (step - j * KSTEPS) * BLOCK_K
        jd = j // (th * tw)
        jh = (j // tw) % th
        jw = j % tw
        id_ = qd + bd - jd * (DD // GD)
        ih = qh + bh - jh * (DH // GH)
        iw = qw + bw - jw * (DW // GW)
        ok = m_ok & (id_ >= 0) & (id_ < D) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        tap = ((k0d + jd * (SD // GD)) * KH + k0h + jh * (SH // GH)) * KW + k0w + jw * (SW // GW)
        acc = channel_step(acc, x_rows, (id_ * H + ih) * W + iw, ok, Wp, g * TAPS + tap, c0, rk, rn, n_ok, CG, COG,
                           DHW, PRECISION, B_K_MAJOR)
    chan, offs, mask = output_tile(nb, od, oh, ow, g, rn, m_ok, n_ok, CO, COG, OD, OH, OW)
{epilogue}
    tl.store(Y + offs, acc, mask=mask)
"""


def phase_steps(stride: int, dilation: int) -> tuple[int, int]:
    """g = gcd(stride, dilation) and the inverse of dilation/g modulo stride/g (0 where stride/g is 1): what the
    phased kernel takes per dim (G*, I*) to find each phase's first tap."""
    g = math.gcd(stride, dilation)
    return g, pow(dilation // g, -1, stride // g) if stride // g > 1 else 0


def phase_plan(phase: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> tuple[int, int, int]:
    """For the outputs o = q * stride + phase of a transposed convolution: the first tap k0 that reaches them, the
    input offset b (input q + b - j * dilation/g for tap k0 + j * stride/g, g = gcd(stride, dilation)) and how many
    taps reach them (none where g does not divide phase + padding)."""
    g, inverse = phase_steps(stride, dilation)
    step = stride // g
    if (phase + padding) % g:
        return 0, 0, 0
    k0 = (phase + padding) // g * inverse % step
    return k0, (phase + padding - k0 * dilation) // stride, max(0, -(-(kernel - k0) // step))


def uses_phases(spec: ConvSpec) -> bool:
    """A strided transposed convolution runs phase by phase: the gather form would multiply the stride^dims - 1 of
    every stride^dims taps that miss."""
    return spec.transposed and max(spec.stride) > 1


STREAM_WEIGHTS = 32  # a streamed program holds its plane's weights in registers: CG x KH x KW of them at most


def uses_direct(spec: ConvSpec, x_shape: Sequence[int], w_shape: Sequence[int]) -> bool:
    """The direct kernel where a GEMM tile would be mostly padding: few input channels per group."""
    cg = x_shape[1] // spec.groups
    return cg < 8


def uses_stream(spec: ConvSpec, x_shape: Sequence[int], w_shape: Sequence[int]) -> bool:
    """The direct kernel's streamed form (templates.stream): a 2-D convolution, stride and dilation 1 along rows, a
    window of several rows, and few enough weights a plane to hold in registers."""
    return (uses_direct(spec, x_shape, w_shape) and not spec.transposed and spec.dims == 2
            and spec.stride[0] == 1 and spec.dilation[0] == 1 and w_shape[2] > 1
            and stream.conv_taps(x_shape[1] // spec.groups, w_shape[2], w_shape[3]) <= STREAM_WEIGHTS)


def gemm_configs(precision: str, cg: int, cog: int, m: int) -> list[Any]:
    """The implicit GEMM's autotuning space, pruned to the problem: no tile wider than the channels it covers. Three
    tiles each: every config costs a compile (seconds), and a model has many regions."""
    import triton

    if precision == "ieee":  # FMA: smaller tiles, fewer stages (no async tensor-core pipeline to feed)
        shapes = [(64, 64, 16, 4, 2), (128, 64, 16, 8, 2), (32, 64, 16, 4, 2)]
    else:
        shapes = [(128, 64, 32, 4, 3), (64, 128, 32, 4, 3), (128, 128, 32, 8, 3)]
    n_cap = max(16, triton.next_power_of_2(cog))
    k_cap = max(16, triton.next_power_of_2(cg))
    m_cap = max(16, triton.next_power_of_2(m))
    seen: set[tuple[int, ...]] = set()
    configs = []
    for bm, bn, bk, warps, stages in shapes:
        key = (min(bm, m_cap), min(bn, n_cap), min(bk, k_cap), warps, stages)
        if key in seen:
            continue
        seen.add(key)
        configs.append(triton.Config({"BLOCK_M": key[0], "BLOCK_N": key[1], "BLOCK_K": key[2]},
                                     num_warps=warps, num_stages=stages))
    return configs


class ConvKernel:
    """One convolution region's compiled kernel (built on its first call, for its spec, epilogue and precision)."""

    def __init__(self, spec: ConvSpec, chain: tuple[Step, ...], precision: str) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        self.spec, self.chain, self.precision = spec, chain, precision
        # Tensor-core products (tf32x3, tf32) read the weight K-major: a [CG, COG] tile takes a transposing store
        # to shared memory before each product (in the sm_90 code, scalar st.shared where a K-major tile takes
        # stmatrix). The likely reason, not yet measured, why on the H200 the GEMM template's Linear layers (B
        # K-major) reached ~100 % of the fp32 speed of light and the convolutions ~60 %. FMA products (ieee) keep
        # [CG, COG].
        self.b_k_major = precision != "ieee"
        self._kernels: dict[str, Any] = {}

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight in the layout this kernel reads (packed_weight)."""
        return packed_weight(weight, self.spec, k_major=self.b_k_major)

    def _kernel(self, form: str, cg: int, cog: int, m: int, out_hw: tuple[int, int] = (1, 1),
                window: tuple[int, int] = (1, 1)) -> Any:
        """form: "stream", "direct", "gemm" or "phased"."""
        if form == "stream" and form not in self._kernels:
            module = codegen.load_source(stream.conv_source(cg, *window, self.chain), "conv_stream")
            self._kernels[form] = codegen.autotuned(module.kernel, stream.configs("rows", *out_hw),
                                                    ["PLANES", "OH", "OW"])
        if form not in self._kernels:
            params, lines = triton_lines(self.chain)
            template = {"direct": _DIRECT_SOURCE, "gemm": _GEMM_SOURCE, "phased": _PHASED_SOURCE}[form]
            source = template.format(epi_params="".join(f"{p}, " for p in params), coords=_COORDS,
                                     epilogue="\n".join(lines), helpers=_GEMM_HELPERS, plane_tile=plane.PLANE_TILE)
            module = codegen.load_source(source, f"conv_{form}")
            if form == "direct":
                configs, key = plane.configs(*out_hw), ["CO", "OD", "OH", "OW", "CG"]
            else:
                configs, key = gemm_configs(self.precision, cg, cog, m), ["M", "CG", "COG"]
            self._kernels[form] = codegen.autotuned(module.kernel, configs, key)
        return self._kernels[form]

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None,
                 operands: Sequence[torch.Tensor]) -> torch.Tensor:
        spec = self.spec
        out_shape = spec.output_shape(x.shape, weight.shape)
        x = x.contiguous()
        y = torch.empty(out_shape, device=x.device, dtype=torch.float32)
        n, c_in = x.shape[:2]
        d, h, w = _three(x.shape[2:], 1)
        od, oh, ow = _three(out_shape[2:], 1)
        kd, kh, kw = _three(weight.shape[2:], 1)
        co = out_shape[1]
        cg, cog = c_in // spec.groups, co // spec.groups
        p3 = spec.three()
        geometry = dict(SD=p3["stride"][0], SH=p3["stride"][1], SW=p3["stride"][2], PD=p3["padding"][0],
                        PH=p3["padding"][1], PW=p3["padding"][2], DD=p3["dilation"][0], DH=p3["dilation"][1],
                        DW=p3["dilation"][2], KD=kd, KH=kh, KW=kw, TRANSPOSED=spec.transposed)
        if uses_stream(spec, x.shape, weight.shape):
            kernel = self._kernel("stream", cg, cog, 0, (oh, ow), (kh, kw))
            kernel[stream.grid("rows", n * co, oh, oh, ow)](
                x, weight.contiguous(), y, *operands, c_in, h, w, co, oh, ow, cog, n * co, CG=cg, KH=kh, KW=kw,
                SW=p3["stride"][2], PH=p3["padding"][1], PW=p3["padding"][2], DW=p3["dilation"][2])
        elif uses_direct(spec, x.shape, weight.shape):
            kernel = self._kernel("direct", cg, cog, 0, (oh, ow))
            kernel[plane.grid(n * co, od, oh, ow)](
                x, weight.contiguous(), y, *operands, c_in, d, h, w, co, od, oh, ow, cg, cog, **geometry)
        elif uses_phases(spec):
            sd, sh, sw = p3["stride"]
            qd, qh, qw = -(-od // sd), -(-oh // sh), -(-ow // sw)
            m = n * qd * qh * qw
            kernel = self._kernel("phased", cg, cog, m)
            assert packed is not None
            phased = {k: v for k, v in geometry.items() if k != "TRANSPOSED"}
            for dim, stride_, dilation in zip("DHW", p3["stride"], p3["dilation"], strict=True):
                phased[f"G{dim}"], phased[f"I{dim}"] = phase_steps(stride_, dilation)
            kernel[lambda meta: (triton_cdiv(m, meta["BLOCK_M"]), triton_cdiv(cog, meta["BLOCK_N"]),
                                 spec.groups * sd * sh * sw)](
                x, packed, y, *operands, m, c_in, d, h, w, co, od, oh, ow, qd, qh, qw, cg, cog, **phased,
                PRECISION=self.precision, B_K_MAJOR=self.b_k_major)
        else:
            m = n * od * oh * ow
            kernel = self._kernel("gemm", cg, cog, m)
            assert packed is not None
            kernel[lambda meta: (triton_cdiv(m, meta["BLOCK_M"]), triton_cdiv(cog, meta["BLOCK_N"]), spec.groups)](
                x, packed, y, *operands, m, c_in, d, h, w, co, od, oh, ow, cg, cog, **geometry,
                PRECISION=self.precision, B_K_MAJOR=self.b_k_major)
        return y


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kernel_operands(chain: Sequence[Step], operands: Sequence[torch.Tensor], out_shape: Sequence[int]
                    ) -> list[torch.Tensor]:
    """The epilogue's tensors as the kernel reads them: channel vectors flat, full tensors in the output's
    contiguous layout (broadcast ones materialised)."""
    found = []
    for step, t in zip(tensor_operands(chain), operands, strict=True):
        if step.operand == "channel":
            found.append(t.reshape(-1).float().contiguous())
        else:
            found.append(t.float().expand(tuple(out_shape)).contiguous())
    return found
