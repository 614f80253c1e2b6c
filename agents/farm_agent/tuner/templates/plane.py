"""The plane tile, shared by the direct (memory-bound) templates: pooling and depthwise-like convolution.

Their output is a stack of planes (every leading index: batch x channel), each OD x OH x OW. One program computes a
BH x BW block of rows and columns at one output depth of one plane: its plane, depth and block come from its
program id by a few scalar divisions, and each element's coordinates are a row and a column, so no element pays
for index division. (The first kernels gave one lane to each flat output index: six to eight 64-bit divisions an
element, the likely reason they reached only 23-37 % of the memory bandwidth on the H200, behind torch.compile.) A
window tap's input is then a shifted tile of the plane, served by the caches after the first tap reads it.

`PLANE_TILE` is the Triton helper the kernels include; `tile_shapes` and `configs` choose the block to the output's
width (a 1-D output: one row of up to 1024 columns); `grid` is the launch; `plane_coords` is the same arithmetic in
Python, for the tests.
"""

from __future__ import annotations

from typing import Any

PLANE_TILE = """
@triton.jit
def plane_tile(OD, OH, OW, BH: tl.constexpr, BW: tl.constexpr):
    # this program's plane, output depth (scalars), rows [BH, 1], columns [1, BW] and the mask of those inside
    pid = tl.program_id(0)
    tiles_w = tl.cdiv(OW, BW)
    per_depth = tl.cdiv(OH, BH) * tiles_w
    per_plane = OD * per_depth
    plane = pid // per_plane
    t = pid - plane * per_plane
    od = t // per_depth
    t = t - od * per_depth
    oh = (t // tiles_w) * BH + tl.arange(0, BH)[:, None]
    ow = (t % tiles_w) * BW + tl.arange(0, BW)[None, :]
    return plane, od, oh, ow, (oh < OH) & (ow < OW)
"""

# (elements per program, warps): the autotuning space, three blocks (each config is a compile)
_BLOCKS = ((1024, 4), (2048, 8), (512, 4))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def tile_shapes(oh: int, ow: int) -> list[tuple[int, int, int]]:
    """(BH, BW, warps) per block size: columns as wide as the output's rows (up to 128, or 1024 for a single row),
    rows filling the rest of the block, nothing much wider or taller than the output."""
    shapes = []
    for block, warps in _BLOCKS:
        bw = min(_pow2_at_least(ow), 1024 if oh == 1 else 128, block)
        bh = max(1, min(_pow2_at_least(oh), block // bw))
        if (bh, bw, warps) not in shapes:
            shapes.append((bh, bw, warps))
    return shapes


def configs(oh: int, ow: int) -> list[Any]:
    import triton

    return [triton.Config({"BH": bh, "BW": bw}, num_warps=warps) for bh, bw, warps in tile_shapes(oh, ow)]


def programs(planes: int, od: int, oh: int, ow: int, bh: int, bw: int) -> int:
    return planes * od * -(-oh // bh) * -(-ow // bw)


def grid(planes: int, od: int, oh: int, ow: int) -> Any:
    return lambda meta: (programs(planes, od, oh, ow, meta["BH"], meta["BW"]),)


def plane_coords(pid: int, od_size: int, oh_size: int, ow_size: int, bh: int, bw: int
                 ) -> tuple[int, int, list[int], list[int]]:
    """plane_tile's arithmetic for one program: (plane, depth, its rows, its columns), before the mask."""
    tiles_w = -(-ow_size // bw)
    per_depth = -(-oh_size // bh) * tiles_w
    per_plane = od_size * per_depth
    plane, t = divmod(pid, per_plane)
    od, t = divmod(t, per_depth)
    return (plane, od, [(t // tiles_w) * bh + i for i in range(bh)], [(t % tiles_w) * bw + i for i in range(bw)])
