"""The streamed direct forms of pooling and depthwise-like convolution: a program walks one pooled (or convolved)
axis and loads each input row or plane once, keeping in registers what the next outputs share.

The tile form (templates.plane) loads every tap of every output from the caches: 27 loads an output for a 3x3x3
pooling window, 9 for a 3x3 convolution. On the H200 that bounded those kernels at 27-46 % of the memory bandwidth
whatever the block (benchmarks/gpu/plane_sweep.py: maxpool3d_video's best tile 1.01 ms, conv2d_depthwise's template
1.74 ms). Streamed, an input slab (a plane of a 3-D pooling, a row of a 2-D one or of a convolution) is read once
per program and reduced over the other axes' taps where it is read: 18 loads an output for that pooling (its depth
window of 3 at stride 2 shares one plane with the next output), 3 for the 3x3 convolution; the same sweep measured
0.91 ms and 1.00 ms (64 % and 68 % of the speed of light, 2.5x and 4.7x torch.compile there).

Pooling, the window along the streamed axis as a ring (`Ring`): `span` slabs, `new` of them read for each output
and the rest carried from the previous one. Convolution (stride 1 along the streamed rows): each input row is added
into the KH output rows it reaches, a ring of KH partial sums, the oldest stored when its last row is in.

The kernels are generated per shape of window (the ring's variables are named in the source) and autotuned over
three tiles (rows x columns, warps) like the plane tile's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from farm_agent.tuner.templates.epilogue import Step, channel_lines, triton_lines

MAX_SPAN = 8  # slabs a ring keeps in registers; a longer window takes the tile form


@dataclass(frozen=True)
class Ring:
    """The streamed axis of a window: kernel taps at stride `stride` apart by `dilation`, from `padding` before."""

    kernel: int
    stride: int
    padding: int
    dilation: int

    @property
    def span(self) -> int:
        """Input slabs one output's window covers, first to last."""
        return (self.kernel - 1) * self.dilation + 1

    @property
    def new(self) -> int:
        """Slabs read for each output; the other span - new are the previous output's last ones."""
        return min(self.stride, self.span)

    @property
    def taps(self) -> list[int]:
        """The ring positions an output combines."""
        return [k * self.dilation for k in range(self.kernel)]

    def reads(self, first: int, outputs: int) -> list[list[int]]:
        """What the generated loop combines for outputs first .. first+outputs-1: each output's input indices,
        taken from the ring as the kernel keeps it (the tests hold this against the window's definition)."""
        ring = [first * self.stride - self.padding + j for j in range(self.span - self.new)]
        combined = []
        for o in range(first, first + outputs):
            start = o * self.stride - self.padding
            ring = ring + [start + j for j in range(self.span - self.new, self.span)]
            combined.append([ring[t] for t in self.taps])
            ring = ring[self.new:]
        return combined


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# (elements per program, warps, outputs per program along the streamed axis); the sweep's best were small blocks
_POOL3D_BLOCKS = ((256, 2, 32), (128, 1, 32), (512, 4, 32))
_ROWS_BLOCKS = ((256, 2, 8), (128, 1, 8), (512, 4, 8))


def configs(mode: str, oh: int, ow: int) -> list[Any]:
    """mode "planes" (a 3-D pooling: rows x columns of one plane, walking depths) or "rows" (planes x columns,
    walking rows)."""
    import triton

    return [triton.Config({"BR": br, "BW": bw, "CHUNK": chunk}, num_warps=warps)
            for br, bw, warps, chunk in tile_shapes(mode, oh, ow)]


def tile_shapes(mode: str, oh: int, ow: int) -> list[tuple[int, int, int, int]]:
    shapes: list[tuple[int, int, int, int]] = []
    for elements, warps, chunk in _POOL3D_BLOCKS if mode == "planes" else _ROWS_BLOCKS:
        bw = min(_pow2_at_least(ow), 64 if mode == "planes" else 128)
        br = max(1, elements // bw)
        if mode == "planes":
            br = min(br, _pow2_at_least(oh))
        if (br, bw, warps, chunk) not in shapes:
            shapes.append((br, bw, warps, chunk))
    return shapes


def programs(mode: str, planes: int, streamed: int, oh: int, ow: int, br: int, bw: int, chunk: int) -> int:
    """planes mode: `streamed` output depths, rows oh; rows mode: `streamed` output rows (oh unused)."""
    chunks = -(-streamed // chunk)
    if mode == "planes":
        return planes * chunks * -(-oh // br) * -(-ow // bw)
    return -(-planes // br) * chunks * -(-ow // bw)


def grid(mode: str, planes: int, streamed: int, oh: int, ow: int) -> Any:
    return lambda meta: (programs(mode, planes, streamed, oh, ow, meta["BR"], meta["BW"], meta["CHUNK"]),)


# --- pooling -----------------------------------------------------------------------------------------------------

_POOL_SLAB_PLANES = """
@triton.jit
def slab(base, s, D, H, W, oh, ow, mask, KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
         PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr):
    # input depth plane s, reduced over the window's rows and columns for a block of output rows x columns
    s_ok = (s >= 0) & (s < D)
    acc = tl.full(mask.shape, {fill}, tl.float32)
    cnt = tl.zeros(mask.shape, tl.float32)
    for kh in tl.static_range(KH):
        ih = oh * SH - PH + kh * DH
        h_ok = s_ok & (ih >= 0) & (ih < H)
        for kw in tl.static_range(KW):
            iw = ow * SW - PW + kw * DW
            ok = mask & h_ok & (iw >= 0) & (iw < W)
            v = tl.load(base + (s * H + ih) * W + iw, mask=ok, other={fill})
            acc = {combine}
            cnt += tl.where(ok, 1.0, 0.0)
    return acc, cnt
"""

_POOL_SLAB_ROWS = """
@triton.jit
def slab(base, s, D, H, W, oh, ow, mask, KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
         PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr):
    # input row s of a block of planes, reduced over the window's columns
    s_ok = (s >= 0) & (s < H)
    acc = tl.full(mask.shape, {fill}, tl.float32)
    cnt = tl.zeros(mask.shape, tl.float32)
    for kw in tl.static_range(KW):
        iw = ow * SW - PW + kw * DW
        ok = mask & s_ok & (iw >= 0) & (iw < W)
        v = tl.load(base + s * W + iw, mask=ok, other={fill})
        acc = {combine}
        cnt += tl.where(ok, 1.0, 0.0)
    return acc, cnt
"""

_POOL_KERNEL = """
import triton
import triton.language as tl
{slab}

@triton.jit
def kernel(X, Y, {epi_params}C, PLANES, D, H, W, OD, OH, OW, KH: tl.constexpr, KW: tl.constexpr,
           SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr,
           DW: tl.constexpr, BR: tl.constexpr, BW: tl.constexpr, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    tiles_w = tl.cdiv(OW, BW)
{head}
{channels}
    o0 = chunk * CHUNK
    b0 = o0 * {stride} - {padding}
{preload}
    for o in range(o0, tl.minimum(o0 + CHUNK, {streamed})):
        b = o * {stride} - {padding}
{load}
{combine}
        offs = out_base + o * {out_step}
{epilogue}
        tl.store(Y + offs, acc, mask=mask)
{shift}
"""

# the program's block: planes mode, one plane's rows x columns (walking depths); rows mode, planes x columns
_HEAD_PLANES = """    tiles = tl.cdiv(OH, BR) * tiles_w
    chunks = tl.cdiv(OD, CHUNK)
    p = pid // (tiles * chunks)
    t = pid - p * (tiles * chunks)
    chunk = t // tiles
    t = t - chunk * tiles
    oh = (t // tiles_w) * BR + tl.arange(0, BR)[:, None]
    ow = (t % tiles_w) * BW + tl.arange(0, BW)[None, :]
    mask = (oh < OH) & (ow < OW)
    chan = p % C + tl.zeros((BR, BW), dtype=tl.int32)
    base = X + p.to(tl.int64) * (D * H * W)
    out_base = p.to(tl.int64) * (OD * OH * OW) + oh * OW + ow"""

_HEAD_ROWS = """    chunks = tl.cdiv(OH, CHUNK)
    pb = pid // (tiles_w * chunks)
    t = pid - pb * (tiles_w * chunks)
    chunk = t // tiles_w
    pl = pb * BR + tl.arange(0, BR)[:, None]
    ow = (t - chunk * tiles_w) * BW + tl.arange(0, BW)[None, :]
    oh = pl
    mask = (pl < PLANES) & (ow < OW)
    chan = (pl // D) % C + tl.zeros((BR, BW), dtype=tl.int32)
    base = X + pl.to(tl.int64) * (H * W)
    out_base = pl.to(tl.int64) * (OH * OW) + ow"""


def pool_source(mode: str, ring: Ring, is_max: bool, divisor: int | None, chain: Sequence[Step]) -> str:
    """The streamed pooling kernel. divisor: average pooling's fixed count (count_include_pad), or None to divide
    by the taps inside (ignored for max). The chain's channel operands are loaded once, before the walk."""
    epi_params, epilogue = triton_lines(chain, indent="        ", hoisted=True)
    fill = 'float("-inf")' if is_max else "0.0"
    combine = "tl.maximum(acc, v)" if is_max else "acc + v"
    slab = (_POOL_SLAB_PLANES if mode == "planes" else _POOL_SLAB_ROWS).format(fill=fill, combine=combine)
    call = "slab(base, {s}, D, H, W, oh, ow, mask, KH, KW, SH, SW, PH, PW, DH, DW)"
    counts = not is_max and divisor is None  # the taps inside each window, carried beside the sums
    keep = ring.span - ring.new
    names = [f"r{j}, c{j}" if counts else f"r{j}, _c" for j in range(ring.span)]
    preload = [f"    {names[j]} = {call.format(s=f'b0 + {j}')}" for j in range(keep)]
    load = [f"        {names[j]} = {call.format(s=f'b + {j}')}" for j in range(keep, ring.span)]
    first, *rest = ring.taps
    combined = [f"        acc = r{first}"]
    for t in rest:
        combined.append(f"        acc = tl.maximum(acc, r{t})" if is_max else f"        acc = acc + r{t}")
    if not is_max:
        if divisor is not None:
            combined.append(f"        acc = acc / {float(divisor)!r}")
        else:
            combined.append("        acc = acc / (" + " + ".join(f"c{t}" for t in ring.taps) + ")")
    shift = []
    if keep:
        shift.append("        " + ", ".join(f"r{j}" for j in range(keep)) + " = "
                     + ", ".join(f"r{j + ring.new}" for j in range(keep)))
        if counts:
            shift.append("        " + ", ".join(f"c{j}" for j in range(keep)) + " = "
                         + ", ".join(f"c{j + ring.new}" for j in range(keep)))
    return _POOL_KERNEL.format(
        slab=slab, epi_params="".join(f"{p}, " for p in epi_params),
        head=_HEAD_PLANES if mode == "planes" else _HEAD_ROWS, stride=ring.stride, padding=ring.padding,
        preload="\n".join(preload), load="\n".join(load), combine="\n".join(combined),
        streamed="OD" if mode == "planes" else "OH", out_step="(OH * OW)" if mode == "planes" else "OW",
        epilogue="\n".join(epilogue), shift="\n".join(shift), channels="\n".join(channel_lines(chain, "mask")))


# --- convolution -------------------------------------------------------------------------------------------------

_CONV_KERNEL = """
import triton
import triton.language as tl

@triton.jit
def kernel(X, Wt, Y, {epi_params}C_IN, H, W, CO, OH, OW, COG, PLANES, CG: tl.constexpr, KH: tl.constexpr,
           KW: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, DW: tl.constexpr,
           BR: tl.constexpr, BW: tl.constexpr, CHUNK: tl.constexpr):
    # rows mode: a block of output planes (image x out-channel) x columns, walking the input rows once; each row
    # is added into the KH output rows it reaches (a0 the oldest, stored when its last row is in)
    pid = tl.program_id(0)
    tiles_w = tl.cdiv(OW, BW)
    chunks = tl.cdiv(OH, CHUNK)
    pb = pid // (tiles_w * chunks)
    t = pid - pb * (tiles_w * chunks)
    chunk = t // tiles_w
    pl = pb * BR + tl.arange(0, BR)[:, None]
    ow = (t - chunk * tiles_w) * BW + tl.arange(0, BW)[None, :]
    p_ok = pl < PLANES
    tile_mask = p_ok & (ow < OW)
    co = pl % CO
    g = co // COG
    chan = co + tl.zeros((BR, BW), dtype=tl.int32)
    x_plane = X + ((pl // CO) * C_IN + g * CG).to(tl.int64) * (H * W)
    w_row = Wt + co * (CG * KH * KW)
{weights}
{columns}
{channels}
    o0 = chunk * CHUNK
{zeros}
    for i in range(o0 - PH, tl.minimum(o0 + CHUNK, OH) - PH + KH - 1):
        row_ok = (i >= 0) & (i < H)
        a{last} = tl.zeros((BR, BW), tl.float32)
{taps}
        o = i + PH - (KH - 1)
        acc = a0
        mask = tile_mask & (o >= o0)
        offs = (pl.to(tl.int64) * OH + o) * OW + ow
{epilogue}
        tl.store(Y + offs, acc, mask=mask)
{shift}
"""


def conv_taps(cg: int, kh: int, kw: int) -> int:
    return cg * kh * kw


def conv_source(cg: int, kh: int, kw: int, chain: Sequence[Step]) -> str:
    """The streamed convolution (stride 1 and dilation 1 along rows) for CG input channels a group and a KH x KW
    window, its weights and the chain's channel operands held in registers."""
    epi_params, epilogue = triton_lines(chain, indent="        ", hoisted=True)
    weights = [f"    w{c}_{h}_{w} = tl.load(w_row + {(c * kh + h) * kw + w}, mask=p_ok, other=0.0)"
               for c in range(cg) for h in range(kh) for w in range(kw)]
    columns = []
    for w in range(kw):
        columns.append(f"    iw{w} = ow * SW - PW + {w} * DW")
        columns.append(f"    ok{w} = tile_mask & (iw{w} >= 0) & (iw{w} < W)")
    taps = []
    for c in range(cg):
        for w in range(kw):
            taps.append(f"        v = tl.load(x_plane + ({c} * H + i) * W + iw{w}, mask=ok{w} & row_ok, other=0.0)")
            for h in range(kh):
                taps.append(f"        a{kh - 1 - h} += v * w{c}_{h}_{w}")
    zeros = [f"    a{j} = tl.zeros((BR, BW), tl.float32)" for j in range(kh - 1)]
    shift = ("        " + ", ".join(f"a{j}" for j in range(kh - 1)) + " = "
             + ", ".join(f"a{j + 1}" for j in range(kh - 1))) if kh > 1 else ""
    return _CONV_KERNEL.format(
        epi_params="".join(f"{p}, " for p in epi_params), weights="\n".join(weights), columns="\n".join(columns),
        zeros="\n".join(zeros), last=kh - 1, taps="\n".join(taps), epilogue="\n".join(epilogue), shift=shift,
        channels="\n".join(channel_lines(chain, "tile_mask")))
