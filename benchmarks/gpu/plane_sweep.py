"""A sweep of the direct (memory-bound) kernels' forms and blocks on one GPU: the template kernels of pooling and
depthwise convolution, each form over a wider space of blocks than its autotuner's three (issue 21: they sat at
24-40 % of the speed of light before the streamed forms).

    python benchmarks/gpu/plane_sweep.py            # on a CUDA machine; ~1-2 min
    TRITON_INTERPRET=1 python benchmarks/gpu/plane_sweep.py --check   # the kernels' arithmetic on CPU, small shapes

Rows, each checked against PyTorch before it is timed:
- `template`: what the templates do (PoolKernel / ConvKernel, their own autotuning).
- `tile`: the plane tile (templates.plane: one program per BH x BW block of one output depth, every tap a shifted
  load of the block), block by block.
- `stream`: the streamed form (templates.stream: a program walks depths or rows, each input plane or row read once),
  block by block and with several walk lengths.
Each row is the template's own kernel with one config fixed (codegen's _Fixed), so the sweep measures the code the
optimizer runs. Prints a table (ms, share of the speed of light = bytes once / 4.8 TB/s) per problem.

The first sweep (docs/kernels-h200-templates/plane-sweep.txt) ran hand-written forms of the same ideas before they
became templates/stream.py: `git show c29c754:benchmarks/gpu/plane_sweep.py`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "agents"), str(ROOT)]

from farm_agent.tuner.templates import codegen, plane, pool  # noqa: E402
from farm_agent.tuner.templates.conv import ConvKernel, ConvSpec  # noqa: E402
from farm_agent.tuner.templates.pool import PoolKernel, PoolSpec  # noqa: E402

BANDWIDTH = 4.8e12
Form = dict[str, tuple[float, torch.Tensor]]


def _timed(fn: Callable[[], object], check: bool) -> float:
    """The median ms of fn (inf when it fails to compile or run: one line, and the sweep goes on)."""
    try:
        if check:
            fn()
            return float("nan")
        return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")
    except Exception as error:  # noqa: BLE001  (one form's failure is a row of the table, not the end of it)
        print(f"  failed: {type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}",
              flush=True)
        return float("inf")


def _fixed(kernel: object, **meta: int) -> object:
    """The template's jit function (under its autotuner, or its one config) with this config alone."""
    warps = meta.pop("warps")
    jit = kernel.fn if isinstance(kernel, (codegen._Fixed, triton.runtime.Autotuner)) else kernel
    return codegen._Fixed(jit, triton.Config(meta, num_warps=warps))


def _row(run: Callable[[], torch.Tensor], check: bool) -> tuple[float, torch.Tensor]:
    ms = _timed(run, check)
    return ms, run() if ms != float("inf") else torch.empty(0)


def _pool_forms(x: torch.Tensor, spec: PoolSpec, stream_shapes: list[tuple[int, int, int, int]],
                tile_shapes: list[tuple[int, int, int]], check: bool) -> Form:
    forms: Form = {}
    kernel = PoolKernel(spec, ())
    forms["template (autotuned)"] = _row(lambda: kernel(x, []), check)
    out = spec.output_shape(x.shape)
    oh, ow = (out[-2] if spec.dims > 1 else 1), out[-1]
    for br, bw, warps, chunk in stream_shapes:
        fixed = PoolKernel(spec, ())
        fixed._kernel = _fixed(fixed._build(oh, ow), BR=br, BW=bw, CHUNK=chunk, warps=warps)
        forms[f"stream {br}x{bw} w{warps} chunk {chunk}"] = _row(lambda k=fixed: k(x, []), check)
    tile = codegen.load_source(pool._SOURCE.format(epi_params="", epilogue="", plane_tile=plane.PLANE_TILE),
                               "sweep_pool").kernel
    for bh, bw, warps in tile_shapes:
        fixed = PoolKernel(spec, ())
        fixed.streamed, fixed._kernel = None, _fixed(tile, BH=bh, BW=bw, warps=warps)
        forms[f"tile {bh}x{bw} w{warps}"] = _row(lambda k=fixed: k(x, []), check)
    return forms


def _conv_forms(x: torch.Tensor, conv: torch.nn.Conv2d, stream_shapes: list[tuple[int, int, int, int]],
                check: bool) -> Form:
    """The template without its bias (an epilogue step there), added after on both sides."""
    weight, bias = conv.weight.detach(), conv.bias.detach()[:, None, None]
    kernel = ConvKernel(ConvSpec.of(conv), (), "ieee")
    forms: Form = {"template (autotuned, no bias)": _row(lambda: kernel(x, weight, None, []) + bias, check)}
    oh, ow = x.shape[-2:]
    for br, bw, warps, chunk in stream_shapes:
        fixed = ConvKernel(ConvSpec.of(conv), (), "ieee")
        jit = fixed._kernel("stream", 1, 1, 0, (oh, ow), tuple(weight.shape[2:]))
        fixed._kernels["stream"] = _fixed(jit, BR=br, BW=bw, CHUNK=chunk, warps=warps)
        forms[f"stream {br}x{bw} w{warps} chunk {chunk}"] = _row(lambda k=fixed: k(x, weight, None, []) + bias,
                                                                 check)
    return forms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="small shapes, correctness only (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    check = args.check
    device = "cpu" if check else "cuda"
    torch.manual_seed(0)
    if check:
        sizes = {"maxpool3d_video": (1, 2, 6, 9, 11), "conv2d_depthwise": (1, 3, 7, 10),
                 "maxpool2d_dilated": (1, 3, 9, 12)}
        planes, rows, tiles = [(4, 8, 1, 2)], [(2, 8, 1, 3)], [(4, 8, 1)]
    else:
        sizes = {"maxpool3d_video": (16, 64, 48, 112, 112), "conv2d_depthwise": (128, 256, 112, 112),
                 "maxpool2d_dilated": (128, 128, 128, 128)}
        planes = [(br, bw, w, chunk) for br, bw, w in ((2, 64, 1), (4, 64, 2), (4, 32, 4), (8, 64, 4))
                  for chunk in (6, 24)]
        rows = [(br, 128, w, chunk) for br, w in ((1, 1), (2, 2), (4, 4), (8, 8)) for chunk in (8, 16, 56)]
        tiles = [(4, 32, 4), (8, 64, 4), (16, 64, 8), (4, 64, 2), (2, 64, 1), (8, 128, 8)]
    for name, shape in sizes.items():
        x = torch.randn(shape, device=device)
        if name == "conv2d_depthwise":
            module: torch.nn.Module = torch.nn.Conv2d(shape[1], shape[1], 3, padding=1, groups=shape[1]).to(device)
            forms = _conv_forms(x, module, rows, check)  # type: ignore[arg-type]
        else:
            module = torch.nn.MaxPool3d(3, stride=2, padding=1) if name == "maxpool3d_video" \
                else torch.nn.MaxPool2d(3, stride=1, padding=1, dilation=2)
            forms = _pool_forms(x, PoolSpec.of(module), planes if name == "maxpool3d_video" else rows, tiles, check)
        with torch.no_grad():
            want = module(x)
            compiled = torch.compile(module) if not check else module
            measured = {"eager": (_timed(lambda: module(x), check), want),
                        "compile": (_timed(lambda: compiled(x), check), want), **forms}
        sol = (x.numel() + want.numel()) * 4 / BANDWIDTH * 1e3
        print(f"{name}: speed of light {sol:.3f} ms", flush=True)
        right = {}
        for form, (ms, got) in measured.items():
            ok = got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4)
            right[form] = ms if ok else float("inf")
            print(f"  {form:<40} {ms:8.3f} ms  {sol / ms * 100 if ms == ms else float('nan'):6.1f} % of SoL"
                  f"  {'ok' if ok else 'WRONG'}", flush=True)
        best = min((f for f in right if f != "eager"), key=lambda f: right[f] if right[f] == right[f] else 0)
        print(f"  best: {best} {right[best]:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
