"""The template kernels on a CPU: their PyTorch references (which do the kernels' index arithmetic) against PyTorch's
own ops, their shape and parameter logic, the Triton source of the epilogue chains (run here on torch tensors
through a stand-in for triton.language), and the fx matcher's rewrites (the rewritten model runs its regions'
PyTorch path on a CPU and must equal the original).

Where Triton is installed, the kernels themselves also run under its CPU interpreter (TRITON_INTERPRET=1); CI has
no Triton, so those tests skip there, and the GPU benchmark (benchmarks/gpu/kernels_on_h200.sh) runs them compiled.
"""

from __future__ import annotations

import ast
import math
import os
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from farm_agent.tuner.candidates import build
from farm_agent.tuner.problem import load_problem
from farm_agent.tuner.templates import codegen, plane, stream
from farm_agent.tuner.templates.attention import shared_bytes
from farm_agent.tuner.templates.attention import tiles as attention_tiles
from farm_agent.tuner.templates.conv import (ConvKernel, ConvSpec, gather_reference, packed_weight, phase_plan,
                                             source_coords, torch_conv, uses_direct, uses_phases, uses_stream)
from farm_agent.tuner.templates.epilogue import Step, describe, reference, tensor_operands, triton_lines
from farm_agent.tuner.templates.gather import GatherKernel
from farm_agent.tuner.templates.gather import plan as gather_plan
from farm_agent.tuner.templates.gemm import GemmKernel, k_major
from farm_agent.tuner.templates.matcher import (AttentionRegion, ConvRegion, CrossEntropyRegion, DistanceRegion,
                                                GatherRegion, GemmRegion, PoolRegion, RowRegion, ScanRegion, regions,
                                                rewrite)
from farm_agent.tuner.templates.pointwise import Instruction, Program
from farm_agent.tuner.templates.pool import PoolSpec, torch_pool, window_reference
from farm_agent.tuner.templates.recurrence import pack, torch_layer
from farm_agent.tuner.templates.pool import streamed as pool_streamed
from farm_agent.tuner.templates import rowreduce
from farm_agent.tuner.templates.rowreduce import RowKernel, RowSpec, plan, torch_rows
from farm_agent.tuner.templates.scan import plan as scan_plan

torch.manual_seed(0)
PROBLEMS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels" / "problems"

CONVS = [  # (spec, input shape, weight shape)
    (ConvSpec(1, (1,), (0,), (1,)), (2, 6, 17), (5, 6, 3)),
    (ConvSpec(1, (3,), (2,), (2,), groups=2), (2, 6, 29), (4, 3, 4)),
    (ConvSpec(2, (1, 1), (1, 1), (1, 1)), (2, 5, 9, 10), (7, 5, 3, 3)),
    (ConvSpec(2, (2, 1), (2, 0), (2, 3), groups=3), (1, 6, 13, 14), (9, 2, 3, 2)),
    (ConvSpec(2, (1, 1), (1, 1), (1, 1), groups=8), (2, 8, 7, 7), (8, 1, 3, 3)),  # depthwise
    (ConvSpec(3, (2, 1, 2), (1, 0, 1), (1, 2, 1)), (1, 4, 6, 7, 8), (3, 4, 3, 2, 3)),
    (ConvSpec(1, (4,), (2,), (1,), transposed=True, output_padding=(1,)), (2, 6, 9), (6, 3, 8)),
    (ConvSpec(2, (2, 2), (1, 1), (1, 1), transposed=True), (2, 4, 5, 6), (4, 3, 4, 4)),
    (ConvSpec(2, (3, 2), (1, 0), (2, 1), groups=2, transposed=True, output_padding=(2, 1)), (1, 4, 5, 4),
     (4, 3, 3, 3)),
    (ConvSpec(3, (2, 2, 2), (1, 1, 1), (1, 1, 1), transposed=True), (1, 3, 3, 4, 5), (3, 2, 4, 4, 4)),
    # 8+ input channels per group: the implicit GEMM, and for these transposed ones its phase form
    (ConvSpec(1, (3,), (1,), (1,), transposed=True, output_padding=(2,)), (2, 8, 7), (8, 4, 5)),
    (ConvSpec(3, (2, 1, 2), (1, 0, 1), (1, 1, 1), transposed=True), (1, 8, 3, 4, 3), (8, 2, 3, 2, 4)),
    (ConvSpec(2, (2, 2), (1, 1), (2, 1), groups=2, transposed=True), (1, 16, 5, 4), (16, 3, 3, 3)),
    # dilated and strided: along H a first tap that is not (r + p) mod s (d/g = 2 has inverse 2 mod 3); along W
    # gcd(s, d) = 3, so phases no tap reaches get the epilogue alone
    (ConvSpec(2, (3, 3), (1, 0), (2, 3), transposed=True), (1, 8, 4, 5), (8, 4, 3, 2)),
]


@pytest.mark.parametrize(("spec", "x_shape", "w_shape"), CONVS, ids=[f"{'T' if s.transposed else ''}conv{s.dims}d-{i}"
                                                                     for i, (s, _, _) in enumerate(CONVS)])
def test_the_implicit_gemm_gather_is_the_convolution(spec: ConvSpec, x_shape: tuple, w_shape: tuple) -> None:
    x, w, b = torch.randn(x_shape, dtype=torch.float64), torch.randn(w_shape, dtype=torch.float64), None
    expected = torch_conv(x, w, b, spec)
    assert spec.output_shape(x_shape, w_shape) == tuple(expected.shape)
    torch.testing.assert_close(gather_reference(x, w, b, spec), expected)
    with FlopCounterMode(display=False) as counter:
        torch_conv(x, w, b, spec)
    assert spec.flops(x_shape, w_shape) == counter.get_total_flops()


def test_conv_specs_come_from_modules_and_refuse_what_the_kernel_does_not_do() -> None:
    spec = ConvSpec.of(nn.Conv2d(4, 8, (3, 5), stride=2, padding="valid", dilation=(1, 2), groups=2))
    assert (spec.dims, spec.stride, spec.padding, spec.dilation, spec.groups) == (2, (2, 2), (0, 0), (1, 2), 2)
    assert ConvSpec.of(nn.Conv1d(3, 3, 5, padding="same")).padding == (2,)
    t = ConvSpec.of(nn.ConvTranspose3d(4, 2, 3, stride=2, output_padding=1))
    assert t.transposed and t.out_pad == (1, 1, 1)
    with pytest.raises(ValueError, match="zero padding"):
        ConvSpec.of(nn.Conv2d(3, 3, 3, padding=1, padding_mode="reflect"))
    with pytest.raises(ValueError, match="asymmetric"):
        ConvSpec.of(nn.Conv1d(3, 3, 4, padding="same"))
    with pytest.raises(ValueError, match="input channels"):
        ConvSpec(2, (1, 1), (0, 0), (1, 1), groups=2).output_shape((1, 6, 4, 4), (4, 2, 3, 3))
    # few input channels per group go to the direct kernel, where a 16-wide dot would mostly multiply padding
    assert uses_direct(ConvSpec(2, (1, 1), (1, 1), (1, 1), groups=32), (1, 32, 8, 8), (32, 1, 3, 3))
    assert not uses_direct(ConvSpec(2, (1, 1), (1, 1), (1, 1)), (1, 64, 8, 8), (32, 64, 3, 3))


@pytest.mark.parametrize(("kernel", "stride", "padding", "dilation"),
                         [(4, 2, 1, 1), (3, 2, 1, 1), (8, 4, 2, 1), (5, 3, 0, 1), (2, 3, 2, 1), (7, 2, 3, 1),
                          (3, 2, 1, 2), (3, 2, 2, 3), (4, 3, 1, 2), (3, 4, 0, 2), (5, 6, 3, 4), (3, 2, 0, 5)])
def test_transposed_phases_meet_exactly_the_taps_that_reach_them(kernel: int, stride: int, padding: int,
                                                                  dilation: int) -> None:
    size = 6
    out = (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1
    g = math.gcd(stride, dilation)
    for o in range(out):
        q, phase = divmod(o, stride)
        k0, base, count = phase_plan(phase, kernel, stride, padding, dilation)
        by_phase = {(k0 + j * (stride // g), q + base - j * (dilation // g)) for j in range(count)
                    if 0 <= q + base - j * (dilation // g) < size}
        by_gather = set()
        for k in range(kernel):
            index, valid = source_coords(torch.tensor([o]), k, size, stride, padding, dilation, transposed=True)
            if bool(valid):
                by_gather.add((k, int(index)))
        assert by_phase == by_gather, (o, by_phase, by_gather)
    assert uses_phases(ConvSpec(2, (2, 2), (1, 1), (1, 1), transposed=True))
    # Dilated too: the gather form multiplied every tap, three in four of them missing at a 2-D stride 2.
    assert uses_phases(ConvSpec(2, (2, 2), (1, 1), (2, 1), transposed=True))
    assert not uses_phases(ConvSpec(2, (1, 1), (1, 1), (2, 1), transposed=True))  # stride 1: every tap reaches
    assert not uses_phases(ConvSpec(2, (2, 2), (1, 1), (1, 1)))


def test_the_packed_weight_is_groups_taps_in_out() -> None:
    w = torch.randn(6, 2, 3, 2)  # conv: [out 6, in/group 2, 3x2], 3 groups -> out/group 2
    packed = packed_weight(w, ConvSpec(2, (1, 1), (0, 0), (1, 1), groups=3))
    assert packed.shape == (3, 6, 2, 2) and packed.is_contiguous()
    assert packed[2, 4, 1, 0] == w[2 * 2 + 0, 1].reshape(-1)[4]
    wt = torch.randn(4, 3, 5)  # transposed: [in 4, out/group 3, 5], 2 groups -> in/group 2
    packed_t = packed_weight(wt, ConvSpec(1, (1,), (0,), (1,), groups=2, transposed=True))
    assert packed_t.shape == (2, 5, 2, 3)
    assert packed_t[1, 3, 0, 2] == wt[1 * 2 + 0, 2, 3]
    # K-major for tensor-core products: [groups, taps, out, in]
    k_major = packed_weight(w, ConvSpec(2, (1, 1), (0, 0), (1, 1), groups=3), k_major=True)
    assert k_major.is_contiguous() and torch.equal(k_major, packed.transpose(2, 3))
    assert ConvKernel(ConvSpec(2, (1, 1), (0, 0), (1, 1), groups=3), (), "tf32x3").pack(w).shape == (3, 6, 2, 2)
    assert torch.equal(ConvKernel(ConvSpec(2, (1, 1), (0, 0), (1, 1), groups=3), (), "ieee").pack(w), packed)


def test_tensor_core_gemms_read_b_k_major() -> None:
    b = torch.randn(3, 5, 7)  # [B, K, N], N contiguous: copied K-major
    kb = k_major(b)
    assert torch.equal(kb, b) and kb.stride(-2) == 1 and kb.data_ptr() != b.data_ptr()
    already = torch.randn(3, 7, 5).transpose(1, 2)  # a Linear's weight read transposed: left as it is
    assert k_major(already).data_ptr() == already.data_ptr()
    shared = k_major(b[:1].expand(3, 5, 7))  # broadcast over the batch: one copy, still broadcast
    assert torch.equal(shared, b[:1].expand(3, 5, 7)) and shared.stride(0) == 0 and shared.stride(-2) == 1


POOLS = [
    (PoolSpec("max", 1, (3,), (2,), (1,), (2,)), (2, 3, 21)),
    (PoolSpec("avg", 1, (5,), (2,), (2,), (1,), count_include_pad=False), (2, 3, 19)),
    (PoolSpec("max", 2, (3, 2), (2, 1), (1, 1), (1, 2)), (2, 3, 11, 9)),
    (PoolSpec("avg", 2, (3, 3), (2, 2), (1, 1), (1, 1)), (3, 10, 12)),  # no batch dim
    (PoolSpec("max", 3, (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1)), (1, 2, 7, 8, 9)),
    (PoolSpec("avg", 3, (2, 3, 2), (2, 1, 2), (1, 1, 0), (1, 1, 1), count_include_pad=False), (1, 2, 5, 6, 7)),
]


@pytest.mark.parametrize(("spec", "shape"), POOLS, ids=[f"{s.kind}{s.dims}d-{i}" for i, (s, _) in enumerate(POOLS)])
def test_the_pooling_window_walk_is_the_pooling(spec: PoolSpec, shape: tuple) -> None:
    x = torch.randn(shape, dtype=torch.float64)
    expected = torch_pool(x, spec)
    assert spec.output_shape(shape) == tuple(expected.shape)
    torch.testing.assert_close(window_reference(x, spec), expected)


def test_pool_specs_come_from_modules_and_refuse_ceil_mode() -> None:
    spec = PoolSpec.of(nn.MaxPool2d(3, padding=1, dilation=2))
    assert (spec.kind, spec.kernel, spec.stride, spec.padding, spec.dilation) == ("max", (3, 3), (3, 3), (1, 1),
                                                                                  (2, 2))
    assert PoolSpec.of(nn.AvgPool3d((1, 2, 2), count_include_pad=False)).count_include_pad is False
    with pytest.raises(ValueError, match="ceil_mode"):
        PoolSpec.of(nn.MaxPool1d(2, ceil_mode=True))
    with pytest.raises(ValueError, match="half the kernel"):
        PoolSpec("max", 1, (3,), (1,), (2,), (1,))


@pytest.mark.parametrize(("od", "oh", "ow"), [(1, 1, 37), (1, 1, 3000), (3, 11, 9), (2, 30, 56), (1, 1, 1)])
def test_the_plane_tiles_cover_every_output_once(od: int, oh: int, ow: int) -> None:
    planes = 3
    for bh, bw, _ in plane.tile_shapes(oh, ow):
        seen: Counter[tuple[int, ...]] = Counter()
        for pid in range(plane.programs(planes, od, oh, ow, bh, bw)):
            p, d, rows, cols = plane.plane_coords(pid, od, oh, ow, bh, bw)
            assert p < planes and d < od
            seen.update((p, d, r, c) for r in rows for c in cols if r < oh and c < ow)  # the kernel's mask
        assert len(seen) == planes * od * oh * ow and set(seen.values()) == {1}


def test_plane_tiles_fit_the_output() -> None:
    assert plane.tile_shapes(1, 4096) == [(1, 1024, 4), (1, 1024, 8), (1, 512, 4)]  # a 1-D output: one long row
    assert [(bh, bw) for bh, bw, _ in plane.tile_shapes(112, 112)] == [(8, 128), (16, 128), (4, 128)]
    assert [(bh, bw) for bh, bw, _ in plane.tile_shapes(56, 56)] == [(16, 64), (32, 64), (8, 64)]
    assert plane.tile_shapes(3, 5) == [(4, 8, 4), (4, 8, 8)]  # no tile much larger than the output
    assert plane.grid(6, 2, 56, 56)({"BH": 16, "BW": 64}) == (6 * 2 * 4 * 1,)


@pytest.mark.parametrize(("kernel", "stride", "padding", "dilation"),
                         [(3, 2, 1, 1), (3, 1, 1, 2), (3, 3, 1, 2), (2, 3, 0, 1), (5, 1, 2, 1), (1, 1, 0, 1),
                          (4, 4, 2, 1)])
def test_a_streamed_ring_combines_exactly_each_outputs_window(kernel: int, stride: int, padding: int,
                                                              dilation: int) -> None:
    ring = stream.Ring(kernel, stride, padding, dilation)
    for first in (0, 3):
        assert ring.reads(first, 6) == [[o * stride - padding + k * dilation for k in range(kernel)]
                                        for o in range(first, first + 6)]
    assert ring.new == min(stride, ring.span) and ring.span - ring.new >= 0


def test_pools_and_small_group_convolutions_stream_where_a_ring_applies() -> None:
    assert pool_streamed(PoolSpec("max", 3, (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1)))[0] == "planes"
    assert pool_streamed(PoolSpec("max", 2, (3, 3), (1, 1), (1, 1), (2, 2)))[0] == "rows"
    assert pool_streamed(PoolSpec("avg", 3, (1, 3, 3), (1, 2, 2), (0, 1, 1), (1, 1, 1)))[0] == "rows"
    assert pool_streamed(PoolSpec("avg", 1, (3,), (1,), (1,), (1,))) is None  # one row a plane: the tile form
    assert pool_streamed(PoolSpec("max", 2, (5, 3), (1, 1), (2, 1), (2, 1))) is None  # a span of 9 rows
    depthwise = ConvSpec(2, (1, 1), (1, 1), (1, 1), groups=8)
    assert uses_stream(depthwise, (2, 8, 9, 9), (8, 1, 3, 3))
    assert uses_stream(ConvSpec(2, (1, 2), (1, 1), (1, 3), groups=4), (2, 8, 9, 9), (4, 2, 3, 3))
    assert not uses_stream(ConvSpec(2, (2, 1), (1, 1), (1, 1), groups=8), (2, 8, 9, 9), (8, 1, 3, 3))  # row stride
    assert not uses_stream(ConvSpec(2, (1, 1), (1, 1), (2, 1), groups=8), (2, 8, 9, 9), (8, 1, 3, 3))  # dilated rows
    assert not uses_stream(ConvSpec(2, (1, 1), (1, 1), (1, 1), groups=8, transposed=True), (2, 8, 9, 9),
                           (8, 1, 3, 3))
    assert not uses_stream(ConvSpec(1, (1,), (1,), (1,), groups=8), (2, 8, 9), (8, 1, 3))  # no rows to walk
    assert not uses_stream(ConvSpec(2, (1, 1), (3, 3), (1, 1), groups=2), (2, 8, 9, 9), (8, 4, 7, 7))  # 196 weights
    assert not uses_stream(ConvSpec(2, (1, 1), (1, 1), (1, 1)), (2, 8, 9, 9), (8, 8, 3, 3))  # the implicit GEMM's


def test_the_streamed_kernels_hold_the_ring_they_say() -> None:
    chain = (Step("add", "channel"), Step("relu"), Step("mul", "full"))
    source = stream.pool_source("planes", stream.Ring(3, 2, 1, 1), True, None, chain)
    ast.parse(source)
    assert "        r0 = r2\n" in source  # the plane the next output shares
    assert source.count("slab(base, b0 +") == 1 and source.count("slab(base, b +") == 2  # one carried, two read
    # the channel operand loaded once before the walk, the full one at each stored row
    assert source.index("E0_chan = tl.load(E0 + chan") < source.index("for o in range")
    assert "acc = acc + E0_chan" in source and "tl.load(E1 + offs, mask=mask" in source
    average = stream.pool_source("rows", stream.Ring(3, 1, 1, 1), False, None, chain)
    ast.parse(average)
    assert "acc = acc / (c0 + c1 + c2)" in average and "c0, c1 = c1, c2" in average
    conv_source = stream.conv_source(2, 3, 3, chain)
    ast.parse(conv_source)
    assert conv_source.count("tl.load(x_plane") == 2 * 3  # each row: one load a channel and column tap
    assert conv_source.count("tl.load(w_row") == 2 * 3 * 3 and "a0, a1 = a1, a2" in conv_source
    for mode in ("planes", "rows"):
        for br, bw, _warps, chunk in stream.tile_shapes(mode, 56, 56):
            assert bw <= 64 and br * bw <= 512 and chunk >= 8
    assert stream.grid("rows", 10, 30, 30, 56)({"BR": 2, "BW": 64, "CHUNK": 8}) == (5 * 4 * 1,)
    assert stream.grid("planes", 10, 24, 56, 56)({"BR": 4, "BW": 64, "CHUNK": 32}) == (10 * 1 * 14 * 1,)


def test_row_specs_view_inputs_as_rows() -> None:
    assert RowSpec("softmax").rows((4, 5, 6)) == (20, 6)
    assert RowSpec("mean", reduced=2, keepdim=True).output_shape((2, 3, 4, 5)) == (2, 3, 1, 1)
    assert RowSpec("logsumexp").output_shape((7, 9)) == (7,)
    assert RowSpec("group_norm", groups=4).rows((2, 8, 3, 5)) == (8, 30)
    with pytest.raises(ValueError, match="groups"):
        RowSpec("group_norm", groups=3).rows((2, 8, 3))
    x = torch.randn(3, 8, 5)
    torch.testing.assert_close(torch_rows(x, RowSpec("group_norm", groups=2)), F.group_norm(x, 2))


# --- epilogue chains ---------------------------------------------------------------------------------------------


class _Pointer:
    """A kernel pointer argument as the stand-in below reads it: base + index -> (tensor, index)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __add__(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tensor, index


def _fake_tl() -> types.SimpleNamespace:
    """The part of triton.language the epilogue source uses, on torch tensors."""
    def load(where: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor, other: float) -> torch.Tensor:
        tensor, index = where
        return torch.where(mask, tensor.reshape(-1)[index.clamp(0, tensor.numel() - 1)], other)

    return types.SimpleNamespace(
        load=load, maximum=lambda a, b: torch.maximum(a, torch.as_tensor(b, dtype=a.dtype)),
        minimum=lambda a, b: torch.minimum(a, torch.as_tensor(b, dtype=a.dtype)),
        where=lambda c, a, b: torch.where(c, a, b), exp=torch.exp, log=torch.log, abs=torch.abs,
        math=types.SimpleNamespace(erf=torch.erf), float32=torch.float32)


CHAINS = [
    (Step("add", "channel"), Step("gelu"), Step("mul", "scalar", value=0.5), Step("add", "full")),
    (Step("mul", "channel"), Step("add", "channel"), Step("silu"), Step("clamp", lo=-1.0, hi=1.5)),
    (Step("rsub", "scalar", value=1.0), Step("sigmoid"), Step("rdiv", "full"), Step("tanh")),
    (Step("hardswish"), Step("leaky_relu", value=0.2), Step("gelu_tanh"), Step("div", "channel")),
    (Step("mish"), Step("softplus"), Step("elu", value=0.7), Step("hardsigmoid"), Step("sub", "full")),
    (Step("relu"), Step("square"), Step("neg"), Step("exp"), Step("abs"), Step("clamp", hi=0.9)),
]


@pytest.mark.parametrize("chain", CHAINS, ids=[describe(c) for c in CHAINS])
def test_the_triton_epilogue_source_computes_the_reference_chain(chain: tuple[Step, ...]) -> None:
    y = torch.randn(6, 5, dtype=torch.float64) * 3
    channel = torch.rand(5, dtype=torch.float64) + 0.5
    full = torch.rand(6, 5, dtype=torch.float64) + 0.5
    operands = [channel if s.operand == "channel" else full for s in tensor_operands(chain)]
    expected = reference(y, chain, operands, channel_dim=1)
    params, lines = triton_lines(chain, indent="")
    scope = {"tl": _fake_tl(), "acc": y.clone(), "chan": torch.arange(5).expand(6, 5),
             "offs": torch.arange(30).reshape(6, 5), "mask": torch.ones(6, 5, dtype=torch.bool)}
    scope.update({name: _Pointer(t) for name, t in zip(params, operands, strict=True)})
    exec("\n".join(lines), {}, scope)  # noqa: S102 - the generated kernel lines, on torch tensors
    torch.testing.assert_close(scope["acc"], expected)


def test_bad_epilogue_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="operand"):
        Step("add")
    with pytest.raises(ValueError, match="scalar operand needs a value"):
        Step("mul", "scalar")
    with pytest.raises(ValueError, match="unknown"):
        Step("softmax")
    with pytest.raises(ValueError, match="clamp needs"):
        Step("clamp")


def test_row_tiles_pack_short_rows_and_search_the_warps_of_long_ones() -> None:
    assert plan(64) == [(4, 64, 4), (8, 64, 4), (16, 64, 4)]
    assert plan(1000) == [(2, 1024, 4), (4, 1024, 8), (8, 1024, 8)]
    assert plan(8192) == [(1, 8192, 8), (1, 8192, 4), (1, 8192, 16)]  # one row a program: 8 warps, or 4, or 16
    assert plan(16384) == [(1, 16384, 16), (1, 16384, 8)]
    assert plan(50304) == [(1, 4096, 8), (1, 2048, 4), (1, 8192, 16)]  # longer than one pass: blocks of a loop


# --- the matcher -------------------------------------------------------------------------------------------------


class Net(nn.Module):
    """Every kind of region, written the ways models write them (modules, functions, methods, operators)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.up = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.scale = nn.Parameter(torch.randn(8, 1, 1))
        self.gn = nn.GroupNorm(4, 8)
        self.fc = nn.Linear(8, 10)
        self.ln = nn.LayerNorm(10)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = F.silu(self.bn(self.conv(x)))
        y = F.max_pool2d(y, 2)
        z = self.up(y) * self.scale + x  # per-channel parameter, then a residual
        z = torch.clamp(self.gn(z), -1.0, 1.0)
        h = z.mean(dim=(2, 3))
        h = 2.0 * self.fc(h).relu()
        return (torch.log_softmax(self.ln(h), dim=-1), torch.logsumexp(z, dim=-1), 0.5 * z.cumsum(-1),
                torch.cummax(z, dim=-1).values)


def test_the_matcher_rewrites_every_region_kind_and_keeps_the_function() -> None:
    model, x = Net().eval(), torch.randn(2, 8, 16, 16)
    rewritten, counts = rewrite(model, [x], "ieee")
    assert counts == {"conv": 2, "pool": 1, "rows": 5, "gemm": 1, "scan": 1}
    found = {r.describe() for r in regions(rewritten)}
    assert "conv2d s(1, 1) p(1, 1) d(1, 1) g1 ieee add[channel]+mul[channel]+add[channel]+silu" in found  # BN folded
    assert "convT2d s(2, 2) p(1, 1) d(1, 1) g1 ieee add[channel]+mul[channel]+add[full]" in found
    assert "group_norm clamp" in found and "mean -" in found and "log_softmax -" in found
    assert "gemm ieee add[channel]+relu+mul[scalar]" in found
    assert "cumsum -" not in found and "cumsum mul[scalar]" in found
    assert "cummax" in rewritten.code  # not covered: left as it was
    assert isinstance(model.conv, nn.Conv2d)  # the original is left alone
    with torch.no_grad():
        for got, want in zip(rewritten(x), model(x), strict=True):
            torch.testing.assert_close(got, want)
        x2 = torch.randn(2, 8, 16, 16) * 3  # other inputs of the same shape
        for got, want in zip(rewritten(x2), model(x2), strict=True):
            torch.testing.assert_close(got, want)


class FunctionalLinears(nn.Module):
    """F.linear as models call it: with a bias and an activation, without a bias, and with a bias alone."""

    def __init__(self) -> None:
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(5, 4)), nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.gelu(F.linear(x, self.w, self.b)), F.linear(x, self.w).relu() * 2.0, F.linear(x, self.w, bias=self.b)


def test_f_linear_is_a_gemm_its_bias_the_chains_first_step() -> None:
    model, x = FunctionalLinears(), torch.randn(2, 7, 4)
    rewritten, counts = rewrite(model, [x], "ieee")
    assert sorted(r.describe() for r in regions(rewritten)) == ["gemm ieee add[channel]+gelu",
                                                                 "gemm ieee relu+mul[scalar]"]
    assert rewritten.code.count("torch._C._nn.linear(") + rewritten.code.count("functional.linear(") == 1  # bias alone
    for got, want in zip(rewritten(x), model(x), strict=True):
        torch.testing.assert_close(got, want)
    assert rewrite(model, [x], "tf32x3")[1] == {"gemm": 3}  # tensor-core products: the bare one too


def test_bare_gemms_go_to_templates_only_with_tensor_core_products() -> None:
    class Attention(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)

    class Projections(nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.mm(x, w), x.mm(w).relu()

    x, w = torch.randn(7, 4), torch.randn(4, 3)
    assert rewrite(Projections(), [x, w], "ieee")[1] == {"gemm": 1}  # the bare one left to cuBLAS
    projections, counts = rewrite(Projections(), [x, w], "tf32x3")
    assert counts == {"gemm": 2}
    for got, want in zip(projections(x, w), Projections()(x, w), strict=True):
        torch.testing.assert_close(got, want)
    q, k = torch.randn(3, 5, 4), torch.randn(3, 6, 4)
    assert rewrite(Attention(), [q, k], "ieee")[1] == {"rows": 1}  # fp32 bmm alone: cuBLAS's ground
    rewritten, counts = rewrite(Attention(), [q, k], "tf32x3")
    assert counts == {"gemm": 1, "rows": 1}
    torch.testing.assert_close(rewritten(q, k), Attention()(q, k))


def test_chains_stop_where_an_op_is_not_one_elementwise_step_of_the_output() -> None:
    class Forks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.bias = nn.Parameter(torch.randn(3, 6))  # neither per-channel nor the output's shape

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x).relu()
            return (h + self.bias) * torch.sigmoid(h)  # h has two users: the chain ends at relu

    model, x = Forks().eval(), torch.randn(5, 3, 6)
    rewritten, counts = rewrite(model, [x], "ieee")
    assert counts == {"gemm": 1}
    assert [r.describe() for r in regions(rewritten)] == ["gemm ieee add[channel]+relu"]
    torch.testing.assert_close(rewritten(x), model(x))


def test_an_untraceable_model_has_its_children_matched() -> None:
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Conv1d(4, 4, 3, padding=1), nn.ReLU(), nn.AvgPool1d(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(x) if x.sum() > 0 else -self.block(-x)

    model, x = Branchy().eval(), torch.randn(2, 4, 16).abs()
    rewritten, counts = rewrite(model, [x], "ieee")
    assert counts == {"conv": 1, "pool": 1}
    torch.testing.assert_close(rewritten(x), model(x))
    torch.testing.assert_close(rewritten(-x), model(-x))


def test_template_candidates_build_and_compute_the_model_function_on_cpu() -> None:
    model, x = Net().eval(), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        expected = model(x)
        for transform in ("triton-templates", "triton-templates-3xtf32"):
            params = {"precision": "ieee" if transform == "triton-templates" else "tf32x3"}
            for got, want in zip(build(transform, model, [x], params)(x), expected, strict=True):
                torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="no region"):
        build("triton-templates", nn.Sequential(nn.Tanh()), [x], {})


def test_a_region_whose_template_fails_falls_back_and_records_why(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = nn.Sequential(nn.Conv1d(3, 4, 3), nn.ReLU()).eval(), torch.randn(2, 3, 10)
    rewritten, _ = rewrite(model, [x], "ieee")
    region = regions(rewritten)[0]
    assert isinstance(region, ConvRegion)

    def broken(*args: object) -> torch.Tensor:
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr("farm_agent.tuner.templates.regions.base.triton_runs_on", lambda t: True)
    monkeypatch.setattr(region, "run_template", broken)
    monkeypatch.setattr(codegen, "FAILURES", {})
    torch.testing.assert_close(rewritten(x), model(x))
    assert region.failed
    assert list(codegen.FAILURES.values()) == ["RuntimeError: PassManager::run failed"]


class Kernels(nn.Module):
    """Pairwise distances, written the ways models write them, each followed by an elementwise chain."""

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rbf = torch.exp(-0.5 * torch.cdist(x, y))  # a Gaussian kernel: the chain is fused into the GEMM
        near = torch.cdist(x, y, compute_mode="use_mm_for_euclid_dist") + z  # a full-shaped operand
        return rbf, near


def test_the_matcher_turns_pairwise_distances_into_the_distance_gemm() -> None:
    model, x, y, z = Kernels().eval(), torch.randn(40, 7), torch.randn(30, 7), torch.randn(40, 30)
    for precision in ("ieee", "tf32x3"):  # fused work: a region even where a bare fp32 GEMM is left to cuBLAS
        rewritten, counts = rewrite(model, [x, y, z], precision)
        assert counts == {"distance": 2}
        assert sorted(r.describe() for r in regions(rewritten)) == [f"cdist {precision} add[full]",
                                                                     f"cdist {precision} mul[scalar]+exp"]
        for got, want in zip(rewritten(x, y, z), model(x, y, z), strict=True):
            torch.testing.assert_close(got, want)
    batched = torch.randn(2, 40, 7), torch.randn(2, 30, 7), torch.randn(2, 40, 30)
    assert rewrite(model, list(batched), "ieee")[1] == {"distance": 2}


def test_distances_pytorch_computes_directly_are_left_alone() -> None:
    class Others(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (torch.cdist(x, y, p=1.0), torch.cdist(x, y, compute_mode="donot_use_mm_for_euclid_dist"),
                    torch.cdist(x[:20], y[:20]))  # at most 25 rows each: PyTorch's direct form

    x, y = torch.randn(40, 7), torch.randn(30, 7)
    assert rewrite(Others(), [x, y], "tf32x3")[1] == {}


def test_distance_kernel_source_adds_the_norms_before_the_chain() -> None:
    source = GemmKernel((Step("exp"),), "ieee", distance=True).source()
    assert "def kernel(A, B, Y, XN, YN, s_yn, M, N, K," in source
    assert source.index("tl.sqrt_rn(tl.maximum(xn[:, None] + yn[None, :] - 2.0 * acc, 0.0))") < \
        source.index("acc = tl.exp(acc)")
    assert "XN" not in GemmKernel((Step("exp"),), "ieee").source()


class Losses(nn.Module):
    """Cross-entropies, written the ways models write them."""

    def __init__(self) -> None:
        super().__init__()
        self.summed = nn.CrossEntropyLoss(reduction="sum", ignore_index=2)
        self.per_row = nn.CrossEntropyLoss(reduction="none")

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.cross_entropy(logits, targets), self.summed(logits, targets),
                2.0 * self.per_row(logits, targets).clamp(max=3.0))  # per row: the chain is fused


def test_the_matcher_turns_cross_entropies_into_one_read_per_row() -> None:
    model = Losses().eval()
    logits, targets = torch.randn(12, 9) * 3.0, torch.randint(0, 9, (12,))
    targets[:3] = 2  # ignored by the summed loss
    rewritten, counts = rewrite(model, [logits, targets], "ieee")
    assert counts == {"rows": 3}
    assert sorted(r.describe() for r in regions(rewritten)) == [
        "cross_entropy mean -", "cross_entropy none clamp+mul[scalar]", "cross_entropy sum -"]
    assert all(isinstance(r, CrossEntropyRegion) for r in regions(rewritten))
    for got, want in zip(rewritten(logits, targets), model(logits, targets), strict=True):
        torch.testing.assert_close(got, want)

    class Scaled(nn.Module):
        def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits, targets) * 0.5

    scaled, counts = rewrite(Scaled(), [logits, targets], "ieee")
    assert counts == {"rows": 1} and [r.describe() for r in regions(scaled)] == ["cross_entropy mean -"]
    assert "mul" in scaled.code  # a reduced loss ends its region: the scale stays in the graph
    torch.testing.assert_close(scaled(logits, targets), Scaled()(logits, targets))


def test_cross_entropies_the_row_kernel_does_not_cover_are_left_alone() -> None:
    class Others(nn.Module):
        def forward(self, logits: torch.Tensor, targets: torch.Tensor, probabilities: torch.Tensor,
                    maps: torch.Tensor, pixels: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (F.cross_entropy(logits, targets, weight=torch.ones(9)),
                    F.cross_entropy(logits, targets, label_smoothing=0.1),
                    F.cross_entropy(logits, probabilities),  # class probabilities, not indices
                    F.cross_entropy(maps, pixels))  # the class dim is not the last

    inputs = [torch.randn(12, 9), torch.randint(0, 9, (12,)), torch.randn(12, 9).softmax(-1), torch.randn(2, 9, 4),
              torch.randint(0, 9, (2, 4))]
    assert rewrite(Others(), inputs, "ieee")[1] == {}


class Scans(nn.Module):
    """Running sums and products, written the ways models write them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(6) + 0.5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.cumsum(x, dim=2) * self.weight + y,  # a per-column parameter and a full-shaped operand
                x.cumprod(-1).clamp(max=2.0), torch.cumsum(x, dim=-1, dtype=torch.float32),
                x.cumsum(1), torch.cumsum(x, -1, dtype=torch.float64))  # not the last dim; not fp32: left alone


def test_the_matcher_turns_cumsums_and_cumprods_along_the_row_into_scans() -> None:
    model, x, y = Scans().eval(), torch.rand(2, 3, 6) + 0.5, torch.randn(2, 3, 6)
    rewritten, counts = rewrite(model, [x, y], "ieee")
    assert counts == {"scan": 3}
    assert sorted(r.describe() for r in regions(rewritten)) == ["cumprod clamp", "cumsum -",
                                                                "cumsum mul[channel]+add[full]"]
    assert "cumsum(1)" in rewritten.code and "torch.float64" in rewritten.code
    for got, want in zip(rewritten(x, y), model(x, y), strict=True):
        torch.testing.assert_close(got, want)


def test_scan_tiles_pack_short_rows_and_loop_over_long_ones() -> None:
    assert scan_plan(37) == [(32, 64, 4), (64, 64, 8), (128, 64, 8)]
    assert scan_plan(4096) == [(1, 4096, 8), (2, 4096, 8)]
    assert scan_plan(32768) == [(1, 4096, 8), (1, 2048, 4), (2, 2048, 8)]


class Masked(nn.Module):
    """Row ops after elementwise ops (a prologue): scales, causal masks built the ways models build them, a bias."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(20)

    def forward(self, s: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k = s.shape[-2:]
        future = torch.ones(q, k, dtype=torch.bool, device=s.device).triu(diagonal=1)
        keep = torch.tril(torch.ones(q, k, device=s.device)).bool()
        present = torch.ones(q, k, dtype=torch.bool, device=s.device).triu()  # row 0 wholly masked: NaN, -inf
        return (torch.softmax((s * 0.125).masked_fill(future, float("-inf")), dim=-1),
                torch.log_softmax(s.masked_fill(~keep, -1e4) / 2.0, dim=-1),
                torch.logsumexp((s + bias).masked_fill(present, float("-inf")), dim=-1),
                torch.softmax(s.masked_fill(present, float("-inf")), dim=-1),
                (s - 1.0).masked_fill(present, float("-inf")).amax(-1), (s * s).masked_fill(future, -2.0).sum(-1),
                self.ln(torch.relu(2.0 * s).masked_fill(future, 0.5)), torch.softmax(s.sigmoid(), dim=-1) + future,
                torch.softmax(s.masked_fill(torch.ones(q, k, device=s.device).tril(-1).bool(), -torch.inf), dim=-1))


def test_the_matcher_fuses_scales_and_causal_masks_before_row_ops() -> None:
    model, s, bias = Masked().eval(), torch.randn(2, 3, 5, 20) * 4.0, torch.randn(2, 3, 5, 20)
    rewritten, counts = rewrite(model, [s, bias], "ieee")
    assert counts == {"rows": 9}
    assert sorted(r.describe() for r in regions(rewritten)) == [
        "add[full]+fill[triu 0] logsumexp -", "fill[tril -1] softmax -", "fill[triu 0] softmax -",
        "fill[triu 1]+div[scalar] log_softmax -",  # ~tril(0) is triu(1)
        "mul[scalar]+fill[triu 1] softmax -", "mul[scalar]+relu+fill[triu 1] layer_norm -", "sigmoid softmax -",
        "square+fill[triu 1] sum -", "sub[scalar]+fill[triu 0] amax -"]
    assert "triu" in rewritten.code and "tril" not in rewritten.code  # still read by the last output
    for got, want in zip(rewritten(s, bias), model(s, bias), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)
    assert model(s, bias)[3][..., 0, :].isnan().all()  # a wholly masked row: NaN, as PyTorch gives it


class Normed(nn.Module):
    """Norms and a pool after elementwise ops: a residual, a scale and shift, a gate by the input itself."""

    def __init__(self) -> None:
        super().__init__()
        self.gn, self.rms, self.pool = nn.GroupNorm(2, 4), nn.RMSNorm(7), nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor, r: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.gn(torch.relu(x + r) * 3.0), self.rms(y * 0.5 - 1.0), self.pool(x.sigmoid() * x)


def test_the_matcher_fuses_elementwise_ops_before_norms_and_pools() -> None:
    model, x, r, y = Normed().eval(), torch.randn(2, 4, 5, 6), torch.randn(2, 4, 5, 6), torch.randn(3, 5, 7)
    rewritten, counts = rewrite(model, [x, r, y], "ieee")
    assert sorted(q.describe() for q in regions(rewritten)) == [
        "add[full]+relu+mul[scalar] group_norm -", "mul[scalar]+sub[scalar] rms_norm -", "sigmoid+mul[full] mean -"]
    for got, want in zip(rewritten(x, r, y), model(x, r, y), strict=True):
        torch.testing.assert_close(got, want)


class GemmGroupNorm(nn.Module):
    """A Linear's [N, C] output group-normed, then a swish written out, a per-channel scale and the residual."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.gn = nn.Linear(16, 16), nn.GroupNorm(4, 16)
        self.scale = nn.Parameter(torch.rand(16) + 0.5)
        with torch.no_grad():
            self.gn.weight.uniform_(0.5, 1.5)
            self.gn.bias.normal_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.gn(self.fc(x))
        return torch.sigmoid(y) * y * self.scale + x


def test_a_group_norm_over_a_linears_features_is_a_row_region() -> None:
    model, x = GemmGroupNorm().eval(), torch.randn(6, 16)
    rewritten, counts = rewrite(model, [x], "tf32x3")
    assert counts == {"gemm": 1, "rows": 1}  # 2-D group norms were left to PyTorch
    # the swish written out (y read twice) is one step of the chain, so the whole gate joins the norm's kernel
    assert sorted(r.describe() for r in regions(rewritten)) == ["gemm tf32x3 add[channel]",
                                                                "group_norm silu+mul[channel]+add[full]"]
    with torch.no_grad():
        torch.testing.assert_close(rewritten(x), model(x))


def test_a_swish_whose_sigmoid_is_read_elsewhere_ends_the_chain() -> None:
    class Shared(nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = F.linear(x, w)
            gate = y.sigmoid()
            return y * gate, gate

    rewritten, _ = rewrite(Shared(), [torch.randn(3, 4), torch.randn(5, 4)], "tf32x3")
    assert [r.describe() for r in regions(rewritten)] == ["gemm tf32x3 -"]


class Elementwise(nn.Module):
    """Elementwise graphs with no producer: one reading its input at four points, a gate over two inputs, one too
    small to be worth a launch, and one whose middle value is also an output (it ends the graph there)."""

    def forward(self, x: torch.Tensor, g: torch.Tensor, small: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.tanh(x * 0.5 - 1.0)
        shared = torch.sigmoid(g) * 3.0
        return (y * torch.sigmoid(x) + 0.1 * x * x, g * F.silu(x), F.relu(small) * 2.0,
                torch.clamp(shared.exp(), max=4.0), shared)


def test_elementwise_graphs_left_over_are_one_pointwise_region_each() -> None:
    model, inputs = Elementwise(), [torch.randn(256, 256), torch.randn(256, 256), torch.randn(8, 8)]
    rewritten, counts = rewrite(model, inputs, "ieee")
    assert counts == {"pointwise": 4}  # the 8 x 8 one left to PyTorch
    # the middle value read outside (`shared`) ends one graph and starts the next
    assert sorted(r.describe() for r in regions(rewritten)) == [
        "pointwise exp+clamp", "pointwise mul+sub+tanh+sigmoid+mul+mul+mul+add", "pointwise sigmoid+mul",
        "pointwise silu+mul"]
    assert "relu" in rewritten.code
    for got, want in zip(rewritten(*inputs), model(*inputs), strict=True):
        torch.testing.assert_close(got, want)


class VarMeans(nn.Module):
    """torch.var_mean over trailing dims (Bessel's correction or none, keepdim), and over a leading dim (not rows)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        var, mean = torch.var_mean(x, dim=-1)
        b = torch.var_mean(x * 2.0, dim=(1, 2), correction=0, keepdim=True)
        c = torch.var_mean(x, dim=2, unbiased=False)
        d = torch.var_mean(x, 0)
        return var, mean, b[0], b[1], c[0], c[1], d[0], d[1]


def test_var_means_over_rows_are_one_row_region_with_two_outputs() -> None:
    model, x = VarMeans(), torch.randn(3, 5, 7) * 2.0 + 0.5
    rewritten, counts = rewrite(model, [x], "ieee")
    assert counts == {"rows": 3}  # var_mean was left to PyTorch; over dim 0 it still is
    assert sorted(r.describe() for r in regions(rewritten)) == ["mul[scalar] var_mean -", "var_mean -", "var_mean -"]
    for got, want in zip(rewritten(x), model(x), strict=True):
        torch.testing.assert_close(got, want)


def test_other_ops_of_several_outputs_are_left_alone() -> None:
    class Tuples(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            pooled, where = F.max_pool2d(x, 2, return_indices=True)
            top = torch.max(x, dim=-1)
            return pooled, where, top.values, top.indices, torch.std_mean(x, dim=-1)[0]

    model, x = Tuples(), torch.randn(2, 3, 8, 8)
    rewritten, counts = rewrite(model, [x], "ieee")
    assert not counts
    for got, want in zip(rewritten(x), model(x), strict=True):
        torch.testing.assert_close(got, want)


class Recurrent(nn.Module):
    """A stacked bidirectional GRU (batch first) and an LSTM without biases over time-major input, their final
    states read too; and forms left to PyTorch: a GRU given its initial state, an LSTM with a projection, nn.RNN."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(6, 20, num_layers=2, batch_first=True, bidirectional=True)
        self.lstm = nn.LSTM(6, 12, bias=False)
        self.seeded = nn.GRU(6, 8, batch_first=True)
        self.projected = nn.LSTM(6, 8, proj_size=4, batch_first=True)
        self.plain = nn.RNN(6, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, h = self.gru(x)
        seq, (h_lstm, c_lstm) = self.lstm(x.transpose(0, 1))
        seeded, _ = self.seeded(x, x.new_ones(1, x.shape[0], 8))
        return out, h, seq, h_lstm, c_lstm, seeded, self.projected(x)[0], self.plain(x)[0]


def test_grus_and_lstms_without_a_state_given_are_one_recurrence_region_each() -> None:
    model, x = Recurrent().eval(), torch.randn(3, 5, 6)
    rewritten, counts = rewrite(model, [x], "tf32x3")
    assert counts == {"recurrence": 2}
    assert sorted(r.describe() for r in regions(rewritten)) == ["gru tf32x3 layers=2 bidirectional",
                                                                "lstm tf32x3 layers=1"]
    for got, want in zip(rewritten(x), model(x), strict=True):
        torch.testing.assert_close(got, want)


def test_the_recurrence_kernels_arithmetic_is_pytorchs() -> None:
    """Layer by layer from the packed weights (the biases folded into the projection but a GRU's b_hn), both
    directions, batch first or time first: each layer's output and an LSTM's last cell state."""
    torch.manual_seed(0)
    for rnn in (nn.GRU(6, 20, num_layers=2, batch_first=True, bidirectional=True), nn.GRU(6, 9, bias=False),
                nn.LSTM(6, 12, num_layers=2, bidirectional=True), nn.LSTM(6, 7, batch_first=True)):
        x = torch.randn(3, 5, 6)
        with torch.no_grad():
            want, state = rnn(x)
            seq, cells = x, []
            for layer in range(rnn.num_layers):
                seq, c = torch_layer(seq, pack(rnn, layer), isinstance(rnn, nn.LSTM), rnn.batch_first)
                cells.append(c)
        torch.testing.assert_close(seq, want, rtol=1e-5, atol=1e-5)
        if isinstance(rnn, nn.LSTM):
            torch.testing.assert_close(torch.cat(cells), state[1], rtol=1e-5, atol=1e-5)


class WrittenOut(nn.Module):
    """Norms as models write them out: RMSNorm by hand (three spellings of the square) with a weight, F.normalize;
    and forms left alone (the mean read twice, the norm along another dim)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(7) + 0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ms = x.pow(2).mean(dim=-1, keepdim=True)
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight,
                torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-5) * x,
                x * (torch.square(x).mean(-1, keepdim=True) + 1e-6).rsqrt(),
                F.normalize(x, dim=-1), F.normalize(x, p=2.0, dim=2, eps=1e-3),
                x * torch.rsqrt(ms + 1e-6) + ms,  # the mean read again: only the mean is a region
                F.normalize(x, dim=1))  # not along the row


def test_the_matcher_finds_norms_written_out() -> None:
    model, x = WrittenOut().eval(), torch.randn(3, 5, 7) * 2.0
    rewritten, counts = rewrite(model, [x], "ieee")
    assert sorted(r.describe() for r in regions(rewritten)) == [
        "normalize -", "normalize -", "rms_norm -", "rms_norm -", "rms_norm mul[channel]", "square mean -"]
    assert "rsqrt" in rewritten.code and rewritten.code.count("normalize(") == 1
    for got, want in zip(rewritten(x), model(x), strict=True):
        torch.testing.assert_close(got, want)


def test_masks_not_built_causal_and_shared_scales_stay_outside_the_row_kernel() -> None:
    class Others(nn.Module):
        def forward(self, s: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
            scaled = s * 0.5
            ones = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool)
            return (torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1),  # a mask from outside
                    torch.softmax(s.masked_fill(ones, 0.0), dim=-1),  # not a triangle
                    torch.softmax(scaled, dim=-1) + scaled,  # the scale has two users: it stays
                    torch.softmax(s.masked_fill(ones.triu(1), 0.0), dim=-2))  # not along the row

    s, mask = torch.randn(2, 6, 6), torch.rand(6, 6) > 0.5
    rewritten, counts = rewrite(Others(), [s, mask], "ieee")
    assert counts == {"rows": 3}
    assert sorted(r.describe() for r in regions(rewritten)) == ["softmax -", "softmax -", "softmax add[full]"]
    assert rewritten.code.count(".masked_fill(") == 3 and "s * 0.5" in rewritten.code
    for got, want in zip(rewritten(s, mask), Others()(s, mask), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)


class Attentions(nn.Module):
    """Scaled dot-product attention as models call it: with a chain (a per-channel gain and a residual), causal with
    its own scale, and the forms the template leaves alone (a mask, dropout)."""

    def __init__(self, dv: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.rand(dv) + 0.5)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor, mask: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        return (F.scaled_dot_product_attention(q, k, v) * self.gain + r,
                torch.tanh(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)),
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def attention_inputs(lq: int, lk: int, d: int, dv: int) -> list[torch.Tensor]:
    return [torch.randn(2, 3, lq, d), torch.randn(2, 3, lk, d), torch.randn(2, 3, lk, dv), torch.randn(2, 3, lq, dv),
            torch.ones(lq, lk, dtype=torch.bool).tril()]


def test_the_matcher_turns_attention_into_the_flash_template_with_tensor_core_products() -> None:
    model, inputs = Attentions(32).eval(), attention_inputs(10, 13, 16, 32)
    assert rewrite(model, inputs, "ieee")[1] == {}  # fp32 FMA attention: PyTorch's own kernels' ground
    for precision in ("tf32x3", "tf32"):
        rewritten, counts = rewrite(model, inputs, precision)
        assert counts == {"attention": 2}
        assert sorted(r.describe() for r in regions(rewritten)) == [f"attention causal {precision} tanh",
                                                                    f"attention {precision} mul[channel]+add[full]"]
        assert "attn_mask" in rewritten.code  # a masked attention is left as it was
        for got, want in zip(rewritten(*inputs), model(*inputs), strict=True):
            torch.testing.assert_close(got, want)

    class Uncovered(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)

    assert rewrite(Uncovered(), inputs[:3], "tf32x3")[1] == {}  # dropout
    assert rewrite(Attentions(24), attention_inputs(10, 13, 16, 24), "tf32x3")[1] == {}  # head dim not a power of 2
    assert rewrite(Attentions(32), attention_inputs(10, 13, 256, 32), "tf32x3")[1] == {}  # past 128


def test_attention_tiles_fit_in_shared_memory() -> None:
    for precision in ("ieee", "tf32x3"):
        for d in (16, 32, 64, 128):
            found = attention_tiles(precision, d, d, 2048)
            assert len(found) == 3
            assert all(shared_bytes(bm, bn, stages, d, d) <= 200 * 1024 for bm, bn, _, stages in found)
    assert attention_tiles("tf32x3", 64, 64, 2048) == [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 8, 3)]
    assert attention_tiles("tf32x3", 128, 128, 2048) == [(128, 32, 8, 3), (64, 32, 4, 2), (32, 32, 4, 2)]
    assert {bn for _, bn, _, _ in attention_tiles("tf32x3", 64, 64, 20)} == {32}  # no wider than the keys


class Lookups(nn.Module):
    """Embedding lookups as models write them (a module with a padding row, F.embedding, torch.embedding; int64 and
    int32 ids, 2-D and 1-D), with chains, and the lookups the template leaves to PyTorch."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(11, dim, padding_idx=0)
        self.positions = nn.Parameter(torch.randn(7, dim))
        self.gain = nn.Parameter(torch.rand(dim) + 0.5)
        self.capped = nn.Embedding(11, dim, max_norm=1.0)  # renormalises its rows in place as it looks them up
        self.capped_table = nn.Parameter(torch.randn(7, dim) * 2.0)
        self.sparse = nn.Embedding(11, dim, sparse=True)
        self.bag = nn.EmbeddingBag(11, dim)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.tokens(ids) * self.gain + r,  # a per-channel gain (over D) and a tensor of the output's shape
                torch.relu(F.embedding(pos, self.positions) * 2.0), torch.embedding(self.positions, pos),
                self.capped(ids), F.embedding(pos, self.capped_table, max_norm=1.0), self.sparse(ids), self.bag(ids))


def lookup_inputs(dim: int) -> list[torch.Tensor]:
    ids = torch.randint(0, 11, (3, 4))
    ids[0, 0] = 0  # the padding row
    return [ids, torch.tensor([6, 0, 3, 3, 5], dtype=torch.int32), torch.randn(3, 4, dim)]


def test_the_matcher_turns_embedding_lookups_into_gathers() -> None:
    model, inputs = Lookups(37).eval(), lookup_inputs(37)
    for precision in ("ieee", "tf32x3"):  # no products: a region at every precision
        rewritten, counts = rewrite(model, inputs, precision)
        assert counts == {"gather": 3}
        assert sorted(r.describe() for r in regions(rewritten)) == [
            "embedding -", "embedding mul[channel]+add[full]", "embedding mul[scalar]+relu"]
    assert "max_norm = 1.0" in rewritten.code and "self.capped(" in rewritten.code  # max_norm, sparse, bags: PyTorch's
    assert "self.sparse(" in rewritten.code and "self.bag(" in rewritten.code
    for got, want in zip(rewritten(*inputs), model(*inputs), strict=True):
        torch.testing.assert_close(got, want)
    assert not rewritten(*inputs)[0][0, 0].sub(inputs[2][0, 0]).any()  # the padding row: zeros, before the chain
    with pytest.raises(IndexError):  # out of range: PyTorch's error, as the original raises it
        rewritten(inputs[0] + 11, *inputs[1:])


def test_gather_tiles_hold_a_row_or_walk_it_in_chunks() -> None:
    assert gather_plan(256) == [(4, 256, 2), (8, 256, 4), (16, 256, 4), (32, 256, 8)]
    assert gather_plan(37) == [(16, 64, 2), (32, 64, 4), (64, 64, 4), (128, 64, 8)]  # rounded up, masked
    assert gather_plan(4096) == [(1, 1024, 2), (2, 1024, 4), (4, 1024, 4), (8, 1024, 8)]  # four chunks a row
    source = GatherKernel((Step("add", "channel"),)).source()
    assert 'eviction_policy="evict_first"' in source and "tl.device_assert(" in source


@pytest.mark.parametrize(("name", "kinds"), [("pairwise_distance", {"distance": 1}), ("conv2d_depthwise", {"conv": 1}),
                                             ("depthwise_bn_hardswish", {"conv": 1}), ("maxpool3d_video", {"pool": 1}),
                                             ("maxpool2d_dilated", {"pool": 1}), ("avgpool1d_overlap", {"pool": 1}),
                                             ("conv_transpose3d_bn_relu", {"conv": 1}), ("cross_entropy", {"rows": 1}),
                                             ("gemm_tall_skinny", {"gemm": 1}), ("cumsum_rows", {"scan": 1}),
                                             ("causal_masked_softmax", {"rows": 1}),
                                             ("attention_sdpa", {"attention": 1}), ("embedding_gather", {"gather": 1}),
                                             ("rms_norm", {"rows": 1}), ("l2_normalize", {"rows": 1}),
                                             ("linear_groupnorm_silu_residual", {"gemm": 1, "rows": 1}),
                                             ("conv_transpose2d_dilated", {"conv": 1}),
                                             ("elementwise_chain", {"pointwise": 1}), ("silu_gate", {"pointwise": 1}),
                                             ("var_mean_rows", {"rows": 1})])
def test_the_benchmark_problems_low_on_the_speed_of_light_have_their_regions(name: str, kinds: dict) -> None:
    problem = load_problem(PROBLEMS / f"{name}.py")  # on the meta device, as tune_h200.py counts them
    rewritten, counts = rewrite(problem.model("meta"), problem.inputs("meta", seed=0), "tf32x3")
    assert counts == kinds
    if name == "causal_masked_softmax":  # the scale and the mask built from torch.ones(...).triu(1) fused
        assert [r.describe() for r in regions(rewritten)] == ["mul[scalar]+fill[triu 1] softmax -"]
        assert "torch.ones" not in rewritten.code and "triu" not in rewritten.code
    if name == "rms_norm":  # written out: the square, mean, eps, rsqrt and product one row op, the weight its chain
        assert [r.describe() for r in regions(rewritten)] == ["rms_norm mul[channel]"]
    if name == "linear_groupnorm_silu_residual":  # the norm, its swish and the residual one row kernel
        assert [r.describe() for r in regions(rewritten)][1] == "group_norm silu+add[full]"
    if name == "conv_transpose2d_dilated":  # phase by phase (dilation 3, stride 2)
        assert uses_phases(regions(rewritten)[0].spec)
    if name in ("depthwise_bn_hardswish", "conv_transpose3d_bn_relu"):  # BatchNorm and the activation fused
        assert [r.describe().split()[-1] for r in regions(rewritten)] in (
            ["add[channel]+mul[channel]+add[channel]+relu"], ["mul[channel]+add[channel]+hardswish"])


# --- under Triton's CPU interpreter, where Triton is installed ---------------------------------------------------


@pytest.fixture
def interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton was imported without its interpreter (it decides when it is imported)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")


def test_the_template_kernels_match_the_model_under_the_interpreter(interpreter: None) -> None:
    model, x = Net().eval(), torch.randn(2, 8, 16, 16)
    rewritten, _ = rewrite(model, [x], "ieee")
    failures = dict(codegen.FAILURES)
    with torch.no_grad():
        for got, want in zip(rewritten(x), model(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert codegen.FAILURES == failures
    assert not any(r.failed for r in regions(rewritten))
    kinds = {type(r) for r in regions(rewritten)}
    assert kinds == {ConvRegion, PoolRegion, RowRegion, GemmRegion, ScanRegion}


def test_every_conv_form_runs_under_the_interpreter(interpreter: None) -> None:
    for spec, x_shape, w_shape in CONVS:
        conv_type = {(False, 1): nn.Conv1d, (False, 2): nn.Conv2d, (False, 3): nn.Conv3d,
                     (True, 1): nn.ConvTranspose1d, (True, 2): nn.ConvTranspose2d,
                     (True, 3): nn.ConvTranspose3d}[(spec.transposed, spec.dims)]
        kwargs = dict(stride=spec.stride, padding=spec.padding, dilation=spec.dilation, groups=spec.groups)
        if spec.transposed:
            kwargs["output_padding"] = spec.out_pad
            conv = conv_type(x_shape[1], w_shape[1] * spec.groups, w_shape[2:], **kwargs)
        else:
            conv = conv_type(x_shape[1], w_shape[0], w_shape[2:], **kwargs)
        model, x = nn.Sequential(conv, nn.GELU()).eval(), torch.randn(x_shape)
        for precision in ("ieee", "tf32x3"):  # [CG, COG] weights, and K-major ones for tensor-core products
            rewritten, counts = rewrite(model, [x], precision)
            assert counts == {"conv": 1}
            with torch.no_grad():
                torch.testing.assert_close(rewritten(x), model(x), rtol=1e-4, atol=1e-4)
            assert not regions(rewritten)[0].failed, codegen.FAILURES



def test_every_pool_form_runs_under_the_interpreter(interpreter: None) -> None:
    for spec, shape in POOLS:  # with a per-channel and a full-shaped operand in the chain
        region = PoolRegion(spec, (Step("mul", "channel"), Step("add", "full"), Step("relu")), [("arg", 0), ("arg", 1)])
        x = torch.randn(shape)
        scale, residual = torch.randn(shape[-spec.dims - 1]), torch.randn(spec.output_shape(shape))
        want = torch.relu(torch_pool(x, spec) * scale.reshape(-1, *[1] * spec.dims) + residual)
        torch.testing.assert_close(region(x, scale, residual), want, rtol=1e-5, atol=1e-5)
        assert not region.failed, codegen.FAILURES


def test_the_distance_gemm_runs_under_the_interpreter(interpreter: None) -> None:
    model = Kernels().eval()
    for shapes in (((40, 7), (30, 7), (40, 30)), ((2, 33, 5), (2, 27, 5), (2, 33, 27)), ((2, 33, 5), (27, 5),
                                                                                         (2, 33, 27))):
        x, y, z = (torch.randn(s) for s in shapes)
        for precision in ("ieee", "tf32x3"):
            rewritten, counts = rewrite(model, [x, y, z], precision)
            assert counts == {"distance": 2}
            with torch.no_grad():
                for got, want in zip(rewritten(x, y, z), model(x, y, z), strict=True):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert not any(r.failed for r in regions(rewritten)), codegen.FAILURES
            assert all(isinstance(r, DistanceRegion) for r in regions(rewritten))


def test_a_depthwise_block_with_its_residual_runs_as_one_plane_kernel_under_the_interpreter(interpreter: None) -> None:
    class Block(nn.Module):
        def __init__(self, conv: nn.Module) -> None:
            super().__init__()
            self.conv, self.bn = conv, nn.BatchNorm2d(6)
            with torch.no_grad():
                self.bn.running_mean.normal_()
                self.bn.running_var.uniform_(0.5, 2.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.hardswish(self.bn(self.conv(x))) + x

    for conv in (nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False),
                 nn.ConvTranspose2d(6, 6, 3, padding=1, groups=6), nn.Conv2d(6, 6, (3, 5), padding=(2, 4),
                                                                           dilation=(2, 2), groups=3)):
        model, x = Block(conv).eval(), torch.randn(2, 6, 9, 11)
        rewritten, counts = rewrite(model, [x], "ieee")
        assert counts == {"conv": 1} and uses_direct(regions(rewritten)[0].spec, x.shape, conv.weight.shape)
        assert regions(rewritten)[0].describe().endswith("hardswish+add[full]")
        with torch.no_grad():
            torch.testing.assert_close(rewritten(x), model(x), rtol=1e-4, atol=1e-4)
        assert not regions(rewritten)[0].failed, codegen.FAILURES


def test_the_cross_entropy_rows_run_under_the_interpreter(interpreter: None) -> None:
    model = Losses().eval()
    for classes in (9, 20000):  # one pass, and the looped online logsumexp (rows longer than MAX_ONE_PASS)
        logits, targets = torch.randn(5, classes) * 3.0, torch.randint(0, classes, (5,))
        targets[1] = 2
        rewritten, counts = rewrite(model, [logits, targets], "ieee")
        assert counts == {"rows": 3}
        with torch.no_grad():
            for got, want in zip(rewritten(logits, targets), model(logits, targets), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert not any(r.failed for r in regions(rewritten)), codegen.FAILURES


def test_tensor_core_gemms_with_a_row_major_b_run_under_the_interpreter(interpreter: None) -> None:
    class Products(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return torch.relu(a @ b), torch.bmm(c, b.expand(2, -1, -1)) * 2.0

    a, b, c = torch.randn(300, 24), torch.randn(24, 40), torch.randn(2, 260, 24)  # 256 rows or more: B copied
    model = Products()
    rewritten, counts = rewrite(model, [a, b, c], "tf32x3")
    assert counts == {"gemm": 2}
    with torch.no_grad():
        for got, want in zip(rewritten(a, b, c), model(a, b, c), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not any(r.failed for r in regions(rewritten)), codegen.FAILURES


def test_f_linear_runs_under_the_interpreter(interpreter: None) -> None:
    model, x = FunctionalLinears(), torch.randn(2, 7, 4)
    for precision in ("ieee", "tf32x3"):
        rewritten, _ = rewrite(model, [x], precision)
        with torch.no_grad():
            for got, want in zip(rewritten(x), model(x), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert not any(r.failed for r in regions(rewritten)), codegen.FAILURES


def test_the_scans_run_under_the_interpreter(interpreter: None) -> None:
    model = Scans().eval()
    for shape in ((3, 5, 6), (2, 3, 5000)):  # short rows packed; long ones looped with a carry over chunks
        x, y = 1.0 + 0.01 * torch.randn(shape), torch.randn(shape)
        model.weight = nn.Parameter(torch.rand(shape[-1]) + 0.5)
        rewritten, counts = rewrite(model, [x, y], "ieee")
        assert counts == {"scan": 3}
        with torch.no_grad():
            for got, want in zip(rewritten(x, y), model(x, y), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
        assert not any(r.failed for r in regions(rewritten)), codegen.FAILURES


def test_row_ops_with_a_prologue_run_under_the_interpreter(interpreter: None) -> None:
    model = Masked().eval()
    for shape in ((2, 3, 5, 20), (1, 1, 3, 17000)):  # one pass, and rows longer than MAX_ONE_PASS (two reads)
        model.ln = nn.LayerNorm(shape[-1])
        s, bias = torch.randn(shape) * 4.0, torch.randn(shape)
        rewritten, counts = rewrite(model, [s, bias], "ieee")
        assert counts == {"rows": 9}
        with torch.no_grad():
            for got, want in zip(rewritten(s, bias), model(s, bias), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
        assert not any(r.failed for r in regions(rewritten)), codegen.FAILURES
    model, x, r, y = Normed().eval(), torch.randn(2, 4, 5, 6), torch.randn(2, 4, 5, 6), torch.randn(3, 5, 7)
    rewritten, counts = rewrite(model, [x, r, y], "ieee")
    assert counts == {"rows": 3}
    with torch.no_grad():
        for got, want in zip(rewritten(x, r, y), model(x, r, y), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not any(q.failed for q in regions(rewritten)), codegen.FAILURES


def runs_as_templates(model: nn.Module, inputs: list[torch.Tensor], counts: dict[str, int],
                      precision: str = "ieee", tol: float = 1e-4) -> None:
    """The model rewritten has these regions, every one ran its kernel, and it computes the model's outputs."""
    rewritten, found = rewrite(model, inputs, precision)
    assert found == counts
    with torch.no_grad():
        got, want = (o if isinstance(o, tuple) else (o,) for o in (rewritten(*inputs), model(*inputs)))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    assert not any(r.failed for r in regions(rewritten)), codegen.FAILURES


def test_a_group_norm_over_a_linears_features_runs_under_the_interpreter(interpreter: None) -> None:
    # the GEMM with a bias alone is left to cuBLAS under ieee
    runs_as_templates(GemmGroupNorm().eval(), [torch.randn(6, 16)], {"rows": 1})


def test_elementwise_graphs_run_as_one_kernel_each_under_the_interpreter(interpreter: None) -> None:
    inputs = [torch.randn(256, 256), torch.randn(256, 256) * 3.0, torch.randn(8, 8)]
    runs_as_templates(Elementwise(), inputs, {"pointwise": 4}, tol=1e-5)


def test_a_pointwise_program_reads_only_registers_it_has() -> None:
    gate = Instruction(Step("mul", "full"), 0, 1)
    assert Program(2, (gate,)).describe() == "mul"
    with pytest.raises(ValueError, match="not yet computed"):
        Program(1, (gate,))
    with pytest.raises(ValueError, match="second register"):
        Instruction(Step("relu"), 0, 1)
    with pytest.raises(ValueError, match="per-channel"):
        Program(1, (Instruction(Step("mul", "channel"), 0),))


def test_var_means_run_under_the_interpreter(interpreter: None) -> None:
    for shape in ((3, 5, 7), (2, 1, 17000)):  # one pass, and rows longer than MAX_ONE_PASS (statistics, then the rest)
        runs_as_templates(VarMeans(), [torch.randn(shape) * 2.0 + 0.5], {"rows": 3})


def test_rows_read_twice_run_on_a_persistent_grid_under_the_interpreter(interpreter: None,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The persistent tiles (a program walking several row blocks, the second read evict-first) give the same
    rows: forced here, since the interpreter runs only an autotuner's first config."""
    assert rowreduce.configs(17000)[-1][-1] and not any(p for *_, p in rowreduce.configs(4096))
    monkeypatch.setattr(rowreduce, "configs", lambda length: [(1, 4096, 8, True)])
    x = torch.randn(7, 17000) * 3.0 + 1.0  # 7 rows over 3 programs (_sm_count off a GPU)
    weight, bias = torch.rand(17000) + 0.5, torch.randn(17000)
    for spec, w, b, want in ((RowSpec("layer_norm"), weight, bias, F.layer_norm(x, (17000,), weight, bias)),
                             (RowSpec("log_softmax"), None, None, torch.log_softmax(x, -1)),
                             (RowSpec("var_mean"), None, None, torch.var_mean(x, -1))):
        got = RowKernel(spec, ())(x, w, b, ())
        for g, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                        strict=True):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    groups = torch.randn(3, 8, 64, 70)  # 6 rows (3 maps x 2 groups) of 4 x 4480 = 17,920
    torch.testing.assert_close(RowKernel(RowSpec("group_norm", groups=2), ())(groups, None, None, ()),
                               F.group_norm(groups, 2), rtol=1e-4, atol=1e-4)


def test_grus_and_lstms_run_as_recurrence_kernels_under_the_interpreter(interpreter: None) -> None:
    for precision in ("ieee", "tf32x3"):
        runs_as_templates(Recurrent().eval(), [torch.randn(3, 5, 6)], {"recurrence": 2}, precision)


def test_attention_runs_under_the_interpreter(interpreter: None) -> None:
    model = Attentions(32).eval()
    for lq, lk in ((10, 13), (150, 70), (70, 150)):  # fewer and more queries than keys, several key blocks
        inputs = attention_inputs(lq, lk, 16, 32)
        rewritten, counts = rewrite(model, inputs, "tf32x3")
        assert counts == {"attention": 2}
        with torch.no_grad():
            for got, want in zip(rewritten(*inputs), model(*inputs), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert not any(r.failed for r in regions(rewritten)), codegen.FAILURES
    q, k, v = torch.randn(3, 40, 32), torch.randn(3, 50, 32), torch.randn(3, 50, 16)
    for precision in ("ieee", "tf32x3"):  # v read as it is, and transposed for K-major tensor-core tiles
        for causal in (False, True):
            region = AttentionRegion(causal, None, (Step("relu"),), [], precision)
            want = torch.relu(F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            torch.testing.assert_close(region(q, k, v), want, rtol=1e-4, atol=1e-4)
            assert not region.failed, codegen.FAILURES


def test_embedding_gathers_run_under_the_interpreter(interpreter: None) -> None:
    for dim in (37, 1100):  # one chunk a row (D not a power of two), and rows walked in chunks of 1024 columns
        model, inputs = Lookups(dim).eval(), lookup_inputs(dim)
        rewritten, counts = rewrite(model, inputs, "ieee")
        assert counts == {"gather": 3}
        with torch.no_grad():
            for got, want in zip(rewritten(*inputs), model(*inputs), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        assert all(isinstance(r, GatherRegion) and not r.failed for r in regions(rewritten)), codegen.FAILURES
    table, kernel = torch.randn(9, 20), GatherKernel(())
    for dtype in (torch.int32, torch.int64):
        for shape in ((5,), (2, 3), ()):
            ids = torch.randint(0, 9, shape, dtype=dtype)
            assert torch.equal(kernel(table, ids, []), F.embedding(ids, table))  # a copy: exact
    ids = torch.tensor([[1, 9], [-1, 3]])
    for lookup in (F.embedding, lambda i, t: kernel(t, i, [])):
        with pytest.raises(IndexError, match="out of range"):
            lookup(ids, table)
    got = kernel.launch(table, ids, [])  # the kernel itself reads nothing for an id out of range
    assert torch.equal(got[0, 0], table[1]) and torch.equal(got[1, 1], table[3])
    assert not got[0, 1].any() and not got[1, 0].any()


class _Compiled:
    """Stands in for Triton's CompiledKernel (no GPU here): what a launch through Triton returns."""

    def run(self, *args: Any) -> None:  # the launcher the direct path calls (through codegen._launch)
        raise AssertionError("launched for real")


class _Through:
    """Stands in for the autotuner in front of a Triton kernel: counts the launches that went through it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        self.best_config = types.SimpleNamespace(kwargs={"BLOCK": 64}, pre_hook=None)

    def __getitem__(self, grid: Any) -> Any:
        def run(*args: Any, **constexprs: Any) -> _Compiled:
            self.calls.append((grid, args))
            return _Compiled()
        return run


def test_a_template_launch_goes_through_triton_once_per_kind_then_straight_to_its_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluator times a call from an idle device: Triton's per-call path (autotuner lookup, binding) is taken
    only for a launch of a new kind, as Triton would specialise or tune it differently."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(codegen, "FAST_LAUNCH", True)
    direct: list[tuple[Any, list[Any]]] = []
    monkeypatch.setattr(codegen, "_launch", lambda compiled, grid, ordered: direct.append((grid, ordered)))
    fn = types.SimpleNamespace(arg_names=["X", "Y", "R", "L", "OP", "BLOCK"])
    inner = _Through()
    launcher = codegen.Launcher(inner, fn, ["R", "L"])
    x, y = torch.zeros(64), torch.zeros(64)
    grid = lambda meta: (meta["R"] // meta["BLOCK"],)  # noqa: E731
    launcher[grid](x, y, 128, 64, OP=1)
    launcher[grid](x, y, 128, 64, OP=1)
    assert len(inner.calls) == 1 and len(direct) == 1
    (where, ordered), = direct
    assert where == (2,) and ordered[0] is x and ordered[1] is y and ordered[2:] == [128, 64, 1, 64]
    launcher[grid](x, y, 128, 64, OP=2)  # another constexpr
    launcher[grid](x, y, 256, 64, OP=1)  # another value of the autotuning key
    launcher[grid](x[1:], y, 128, 64, OP=1)  # a tensor off 16-byte alignment: Triton specialises on it
    launcher[grid](x, y, 128, 1, OP=1)  # an int that is 1
    assert len(inner.calls) == 5 and len(direct) == 1
    monkeypatch.setattr(codegen, "FAST_LAUNCH", False)
    launcher[grid](x, y, 128, 64, OP=1)
    assert len(inner.calls) == 6 and len(direct) == 1


def test_norms_written_out_run_as_row_kernels_under_the_interpreter(interpreter: None) -> None:
    model, x = WrittenOut().eval(), torch.randn(3, 5, 7) * 2.0
    rewritten, _ = rewrite(model, [x], "ieee")
    with torch.no_grad():
        for got, want in zip(rewritten(x), model(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert not any(r.failed for r in regions(rewritten)), codegen.FAILURES
    long = torch.randn(2, 17000)  # a row longer than MAX_ONE_PASS: the looped kernel's normalize
    torch.testing.assert_close(RowKernel(RowSpec("normalize"), ())(long, None, None, ()), F.normalize(long, dim=-1))
