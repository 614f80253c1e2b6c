"""Compile every template kernel for a GPU target without a GPU: Triton's front end, its MLIR passes, LLVM and the
ptxas it ships, down to a cubin, for each template form (conv GEMM, phased and direct, normal and transposed, each
precision; GEMM and pairwise distances; attention, each precision, causal or not; pooling max and average; each row
op one-pass and looped, with and without a prologue; each scan packed and looped; the embedding gather, each tile,
int32 and int64 ids, a row in one chunk and in a loop; an elementwise graph; a GRU's and an LSTM's recurrence, each
tile and precision), each with an epilogue chain of every operand kind.

    python benchmarks/kernels/compile_check.py [--arch 90] [--warps 4]

Needs only the triton package (no CUDA device, no driver). What the CPU interpreter cannot show (the compiler's
type and layout rules, tensor-core dot lowering per precision, register limits) shows here. Exit 1 if any fails.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]

from farm_agent.tuner.templates import (attention, codegen, conv, gather, gemm, plane, pointwise,  # noqa: E402
                                        pool, recurrence, rowreduce, scan, stream)
from farm_agent.tuner.templates import prologue as prologue_module  # noqa: E402
from farm_agent.tuner.templates.epilogue import Step, triton_lines  # noqa: E402

CHAIN = (Step("add", "channel"), Step("mul", "scalar", value=0.5), Step("gelu"), Step("add", "full"),
         Step("clamp", lo=-3.0, hi=3.0), Step("hardswish"))
PROLOGUE = (Step("mul", "scalar", value=0.125), Step("add", "full"),
            prologue_module.CausalFill("triu", 1, float("-inf")), Step("relu"))


def compile_kernel(fn: Any, runtime: dict[str, str], constants: dict[str, Any], arch: int, warps: int,
                   stages: int = 3, **options: Any) -> float:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {}
    for name in fn.arg_names:
        signature[name] = runtime[name] if name in runtime else "constexpr"
    missing = [n for n in fn.arg_names if n not in runtime and n not in constants]
    if missing:
        raise ValueError(f"no value for {missing}")
    started = time.perf_counter()
    triton.compile(ASTSource(fn, signature, constexprs=constants), target=GPUTarget("cuda", arch, 32),
                   options={"num_warps": warps, "num_stages": stages, **options})
    return time.perf_counter() - started


def epi_types(params: list[str]) -> dict[str, str]:
    return {p: "*fp32" for p in params}


def cases() -> list[tuple[Any, ...]]:
    """(name, kernel, runtime types, constants, warps, stages[, compile options])."""
    found = []
    params, lines = triton_lines(CHAIN)
    epi = "".join(f"{p}, " for p in params)
    ints = lambda *names: {n: "i32" for n in names}  # noqa: E731
    geometry = dict(SD=2, SH=2, SW=1, PD=1, PH=1, PW=0, DD=1, DH=1, DW=2, KD=3, KH=3, KW=2)
    phase_steps = {f"{c}{dim}": v for dim in "DHW"  # the phased form's per-dim gcd (G*) and inverse (I*)
                   for c, v in zip("GI", conv.phase_steps(geometry[f"S{dim}"], geometry[f"D{dim}"]), strict=True)}
    for transposed in (False, True):
        src = conv._GEMM_SOURCE.format(epi_params=epi, coords=conv._COORDS, epilogue="\n".join(lines),
                                       helpers=conv._GEMM_HELPERS)
        module = codegen.load_source(src, "check_conv_gemm")
        for precision, (bm, bn, bk, warps, stages) in (("ieee", (64, 64, 16, 4, 2)), ("tf32x3", (128, 64, 32, 4, 3)),
                                                       ("tf32", (128, 128, 32, 8, 3))):
            found.append((f"conv-gemm transposed={transposed} {precision}", module.kernel,
                          {"X": "*fp32", "Wp": "*fp32", "Y": "*fp32", **epi_types(params),
                           **ints("M", "C_IN", "D", "H", "W", "CO", "OD", "OH", "OW", "CG", "COG")},
                          {**geometry, "TRANSPOSED": transposed, "PRECISION": precision,
                           "B_K_MAJOR": precision != "ieee", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, warps,
                          stages))
        if transposed:
            src = conv._PHASED_SOURCE.format(epi_params=epi, epilogue="\n".join(lines), helpers=conv._GEMM_HELPERS)
            module_p = codegen.load_source(src, "check_conv_phased")
            for precision in ("ieee", "tf32x3"):
                found.append((f"conv-phased {precision}", module_p.kernel,
                              {"X": "*fp32", "Wp": "*fp32", "Y": "*fp32", **epi_types(params),
                               **ints("M", "C_IN", "D", "H", "W", "CO", "OD", "OH", "OW", "QD", "QH", "QW", "CG",
                                      "COG")},
                              {**geometry, **phase_steps, "PRECISION": precision,
                               "B_K_MAJOR": precision != "ieee", "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32}, 4,
                              3))
        src = conv._DIRECT_SOURCE.format(epi_params=epi, coords=conv._COORDS, epilogue="\n".join(lines),
                                         plane_tile=plane.PLANE_TILE)
        module = codegen.load_source(src, "check_conv_direct")
        for bh, bw, warps in ((8, 128, 4), (1, 1024, 8)):
            found.append((f"conv-direct transposed={transposed} {bh}x{bw}", module.kernel,
                          {"X": "*fp32", "Wt": "*fp32", "Y": "*fp32", **epi_types(params),
                           **ints("C_IN", "D", "H", "W", "CO", "OD", "OH", "OW", "CG", "COG")},
                          {**geometry, "TRANSPOSED": transposed, "BH": bh, "BW": bw}, warps, 2))
    for distance in (False, True):
        module = codegen.load_source(gemm.GemmKernel(CHAIN, "ieee", distance=distance).source(), "check_gemm")
        norms = {"XN": "*fp32", "YN": "*fp32", "s_yn": "i32"} if distance else {}
        for precision, (bm, bn, bk, warps, stages) in (("ieee", (128, 128, 16, 8, 2)),
                                                       ("tf32x3", (128, 128, 32, 8, 3)),
                                                       ("tf32", (128, 256, 32, 8, 3))):
            found.append((f"{'distance' if distance else 'gemm'} {precision}", module.kernel,
                          {"A": "*fp32", "B": "*fp32", "Y": "*fp32", **norms, **epi_types(params),
                           **ints("M", "N", "K", "s_ab", "s_am", "s_ak", "s_bb", "s_bk", "s_bn")},
                          {"PRECISION": precision, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                          warps, stages))
    module = codegen.load_source(pool._SOURCE.format(epi_params=epi, epilogue="\n".join(lines),
                                                     plane_tile=plane.PLANE_TILE), "check_pool")
    for is_max, (bh, bw, warps) in ((True, (16, 128, 8)), (False, (1, 1024, 4))):
        found.append((f"pool max={is_max} {bh}x{bw}", module.kernel,
                      {"X": "*fp32", "Y": "*fp32", **epi_types(params), **ints("C", "D", "H", "W", "OD", "OH", "OW")},
                      {**geometry, "IS_MAX": is_max, "INCLUDE_PAD": False, "BH": bh, "BW": bw}, warps, 2))
    for mode, ring, is_max, divisor in (("planes", stream.Ring(3, 2, 1, 1), True, None),
                                        ("rows", stream.Ring(3, 1, 1, 2), True, None),
                                        ("rows", stream.Ring(3, 2, 1, 1), False, None),
                                        ("planes", stream.Ring(2, 2, 0, 1), False, 8)):
        src = stream.pool_source(mode, ring, is_max, divisor, CHAIN)
        module = codegen.load_source(src, f"check_pool_{mode}")
        for br, bw, warps, chunk in stream.tile_shapes(mode, 56, 56)[:2]:
            found.append((f"pool-stream {mode} max={is_max} ring={ring.kernel}/{ring.stride} {br}x{bw}", module.kernel,
                          {"X": "*fp32", "Y": "*fp32", **epi_types(params),
                           **ints("C", "PLANES", "D", "H", "W", "OD", "OH", "OW")},
                          {k: geometry[k] for k in ("KH", "KW", "SH", "SW", "PH", "PW", "DH", "DW")}
                          | {"BR": br, "BW": bw, "CHUNK": chunk}, warps, 2))
    for cg, kh, kw in ((1, 3, 3), (2, 3, 5)):
        module = codegen.load_source(stream.conv_source(cg, kh, kw, CHAIN), "check_conv_stream")
        found.append((f"conv-stream cg={cg} {kh}x{kw}", module.kernel,
                      {"X": "*fp32", "Wt": "*fp32", "Y": "*fp32", **epi_types(params),
                       **ints("C_IN", "H", "W", "CO", "OH", "OW", "COG", "PLANES")},
                      {"CG": cg, "KH": kh, "KW": kw, "SW": 1, "PH": 1, "PW": 1, "DW": 1, "BR": 2, "BW": 128,
                       "CHUNK": 8}, 2, 2))
    # the row ops as they are, and after a prologue (a scale, a tensor of the input's shape, a causal fill)
    for prologue, masks in (((), (0,)), (PROLOGUE, (1, 2))):
        kernel = rowreduce.RowKernel(rowreduce.RowSpec("softmax"), CHAIN, prologue)
        module = codegen.load_source(kernel.source(), "check_rows")
        pro_types = {f"P{i}": "*fp32" for i in range(len(prologue_module.tensor_steps(prologue)))}
        for op in rowreduce.OPS:
            if prologue and op in ("cross_entropy", "group_norm"):
                continue
            for one_pass, rows, block, warps, persist in ((True, 4, 1024, 8, False), (False, 1, 4096, 8, False),
                                                          (False, 1, 4096, 8, True)):
                for mask in masks[:1] if op not in ("softmax", "layer_norm") else masks:
                    found.append((f"rows {op} one_pass={one_pass} persist={persist}"
                                  + (f" prologue mask={mask}" if prologue else ""),
                                  module.kernel,
                                  {"X": "*fp32", "Y": "*fp32", "Y2": "*fp32", "Wt": "*fp32", "Bs": "*fp32",
                                   "T": "*i64", **epi_types(params), **pro_types,
                                   **ints("R", "L", "CHANNELS", "G", "S", "CORR", "IGNORE", "Q", "DIAG"),
                                   "eps": "fp32"},
                                  {"OP": rowreduce.OP_CODE[op], "LSE": op in rowreduce.LSE_OPS, "HAS_W": True,
                                   "HAS_B": True, "ONE_PASS": one_pass, "ROW_OUT": op in rowreduce.ROW_OUTPUT,
                                   "HAS_PRO": bool(prologue), "MASK": mask, "ROWS": rows, "BLOCK": block,
                                   "PERSIST": persist},
                                  warps, 2))
    module = codegen.load_source(scan.ScanKernel(scan.ScanSpec("cumsum"), CHAIN).source(), "check_scan")
    for op in scan.OPS:
        for length in (64, 32768):
            for rows, block, warps in scan.plan(length):
                found.append((f"scan {op} {rows}x{block}", module.kernel,
                              {"X": "*fp32", "Y": "*fp32", **epi_types(params), **ints("R", "L")},
                              {"OP": scan.OP_CODE[op], "LOOP": length > scan.MAX_ONE_CHUNK, "ROWS": rows,
                               "BLOCK": block}, warps, 2))
    module = codegen.load_source(attention.AttentionKernel(CHAIN, "ieee", False, None).source(), "check_attention")
    for precision, causal, d, dv in (("ieee", False, 64, 64), ("tf32x3", False, 64, 64), ("tf32x3", True, 64, 64),
                                     ("tf32x3", False, 128, 128), ("tf32x3", True, 16, 32), ("tf32", False, 64, 64)):
        for config in attention.configs(precision, d, dv, 2048):
            bm, bn = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
            found.append((f"attention {precision} causal={causal} d={d}/{dv} {bm}x{bn}", module.kernel,
                          {"Q": "*fp32", "K": "*fp32", "V": "*fp32", "Y": "*fp32", **epi_types(params),
                           **ints("LQ", "LK"), "qk_scale": "fp32"},
                          {"PRECISION": precision, "CAUSAL": causal, "V_K_MAJOR": precision != "ieee", "D": d,
                           "DV": dv, "BLOCK_M": bm, "BLOCK_N": bn},
                          config.num_warps, config.num_stages))
    module = codegen.load_source(gather.GatherKernel(CHAIN).source(), "check_gather")
    for ids in ("i64", "i32"):
        for dim in (256, 4096):  # one chunk a row, and rows walked in chunks of MAX_BLOCK_D
            for rows, block, warps in gather.plan(dim):
                found.append((f"embedding_gather ids={ids} d={dim} {rows}x{block}", module.kernel,
                              {"IDS": f"*{ids}", "W": "*fp32", "Y": "*fp32", **epi_types(params),
                               **ints("N", "V", "D", "s_w")},
                              {"ROWS": rows, "BLOCK_D": block}, warps, 2,
                              {"debug": True, "sanitize_overflow": False}))  # as GatherKernel launches it: the assert
    # an elementwise graph of every step kind: a register read at several points, a second input, numbers, a clamp
    body = tuple(pointwise.Instruction(step, a, b) for step, a, b in (
        (Step("mul", "scalar", value=1.7), 0, None), (Step("tanh"), 2, None), (Step("sigmoid"), 0, None),
        (Step("mul", "full"), 3, 4), (Step("rsub", "full"), 5, 1), (Step("clamp", lo=-2.0, hi=2.0), 6, None),
        (Step("gelu"), 7, None)))
    program = pointwise.Program(2, body)
    module = codegen.load_source(pointwise.source(program), "check_pointwise")
    for block, warps in pointwise.plan():
        found.append((f"pointwise {program.describe()} {block}", module.kernel,
                      {"X0": "*fp32", "X1": "*fp32", "Y": "*fp32", "N": "i64"}, {"BLOCK": block}, warps, 2))
    module = codegen.load_source(recurrence._SOURCE, "check_recurrence")
    for lstm, hidden in ((False, 128), (True, 256), (True, 100)):
        for precision in ("ieee", "tf32x3"):
            for config in recurrence.configs(512, hidden):
                bb, bn = config.kwargs["BLOCK_B"], config.kwargs["BLOCK_N"]
                found.append((f"recurrence {'lstm' if lstm else 'gru'} {precision} h={hidden} {bb}x{bn}",
                              module.kernel, {**{n: "*fp32" for n in ("XP", "W", "BHN", "Y", "C")},
                                              **ints("B", "T", "s_xb", "s_xt", "s_yb", "s_yt")},
                              {"H": hidden, "G": 4 if lstm else 3, "LSTM": lstm, "PRECISION": precision,
                               **config.kwargs}, config.num_warps, config.num_stages))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    args = parser.parse_args()
    failed = 0
    for name, fn, runtime, constants, warps, stages, *options in cases():
        if args.only not in name:
            continue
        try:
            extra = options[0] if options else {}
            seconds = compile_kernel(fn, runtime, constants, args.arch, warps, stages, **extra)
            print(f"ok   {name} ({seconds:.1f} s)", flush=True)
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
            traceback.print_exc(limit=3)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
