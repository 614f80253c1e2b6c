"""Farm's Triton kernels against eager PyTorch and torch.compile on this GPU: correctness and speed.

    python benchmarks/kernels/triton_kernels.py [--out results.json]

For each kernel family and a few sizes: the relative norm error ||out - ref|| / ||ref|| against a float64
reference, and the median time (triton.testing.do_bench: CUDA events, L2 flushed between runs) of eager, torch.compile
(default) and the Triton kernel. The GEMM is timed in each of its precisions; eager and compile in fp32 and TF32.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "agents"))

from farm_agent.tuner.triton_kernels.linear_act import linear_act  # noqa: E402
from farm_agent.tuner.triton_kernels.norm import norm  # noqa: E402
from farm_agent.tuner.triton_kernels.softmax import softmax  # noqa: E402


def bench(fn: Callable[[], torch.Tensor]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def tf32(enabled: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def linear_case(m: int, k: int, n: int, act: str) -> dict:
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda") / k**0.5
    b = torch.randn(n, device="cuda")
    torch_act = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}[act]
    ref = torch_act(x.double() @ w.double().T + b.double())

    def eager() -> torch.Tensor:
        return torch_act(F.linear(x, w, b))

    row: dict = {"kernel": f"linear+{act}", "shape": [m, k, n], "flops": 2 * m * n * k}
    for mode in ("fp32", "tf32"):
        tf32(mode == "tf32")
        torch._dynamo.reset()
        compiled = torch.compile(eager)
        row[f"eager_{mode}_ms"] = bench(eager)
        out = compiled()
        row[f"compile_{mode}_ms"] = bench(compiled)
        row[f"compile_{mode}_err"] = rel_err(out, ref)
    tf32(False)
    for precision in ("ieee", "tf32", "fp16"):
        def mine(p: str = precision) -> torch.Tensor:
            return linear_act(x, w, b, act, p)
        row[f"triton_{precision}_err"] = rel_err(mine(), ref)
        row[f"triton_{precision}_ms"] = bench(mine)
    return row


def norm_case(rows: int, n: int, rms: bool) -> dict:
    x = torch.randn(rows, n, device="cuda") * 3 + 1
    w = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")

    def eager() -> torch.Tensor:
        return F.rms_norm(x, (n,), w, 1e-6) if rms else F.layer_norm(x, (n,), w, b, 1e-5)

    def mine() -> torch.Tensor:
        return norm(x, w, None, 1e-6, rms=True) if rms else norm(x, w, b, 1e-5, rms=False)

    ref = (F.rms_norm(x.double(), (n,), w.double(), 1e-6) if rms
           else F.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5))
    torch._dynamo.reset()
    compiled = torch.compile(eager)
    compiled()
    return {"kernel": "rmsnorm" if rms else "layernorm", "shape": [rows, n], "bytes": 2 * x.numel() * 4,
            "eager_ms": bench(eager), "compile_ms": bench(compiled), "triton_ms": bench(mine),
            "triton_err": rel_err(mine(), ref), "compile_err": rel_err(compiled(), ref)}


def softmax_case(rows: int, n: int) -> dict:
    x = torch.randn(rows, n, device="cuda") * 4

    def eager() -> torch.Tensor:
        return torch.softmax(x, dim=-1)

    def mine() -> torch.Tensor:
        return softmax(x)

    ref = torch.softmax(x.double(), dim=-1)
    torch._dynamo.reset()
    compiled = torch.compile(eager)
    compiled()
    return {"kernel": "softmax", "shape": [rows, n], "bytes": 2 * x.numel() * 4,
            "eager_ms": bench(eager), "compile_ms": bench(compiled), "triton_ms": bench(mine),
            "triton_err": rel_err(mine(), ref), "compile_err": rel_err(compiled(), ref)}


LINEAR = [(8192, 4096, 4096, "gelu"), (16384, 1024, 4096, "relu"), (4096, 4096, 11008, "silu"),
          (256, 4096, 4096, "gelu")]
NORM = [(65536, 1024, False), (16384, 4096, False), (4096, 32768, False), (65536, 1024, True), (16384, 4096, True)]
SOFTMAX = [(65536, 1024), (16384, 4096), (2048, 65536)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "linear": [linear_case(*c) for c in LINEAR], "norm": [norm_case(*c) for c in NORM],
               "softmax": [softmax_case(*c) for c in SOFTMAX]}
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    for row in results["linear"]:
        print(f"{row['kernel']:>12} {row['shape']!s:>20}  eager fp32 {row['eager_fp32_ms']:7.3f}  compile fp32 "
              f"{row['compile_fp32_ms']:7.3f}  triton ieee {row['triton_ieee_ms']:7.3f} "
              f"(err {row['triton_ieee_err']:.1e})"
              f" | eager tf32 {row['eager_tf32_ms']:7.3f}  compile tf32 {row['compile_tf32_ms']:7.3f}  triton tf32 "
              f"{row['triton_tf32_ms']:7.3f} ({row['triton_tf32_err']:.1e})  triton fp16 {row['triton_fp16_ms']:7.3f}"
              f" ({row['triton_fp16_err']:.1e})")
    for row in results["norm"] + results["softmax"]:
        print(f"{row['kernel']:>12} {row['shape']!s:>20}  eager {row['eager_ms']:7.3f}  "
              f"compile {row['compile_ms']:7.3f}"
              f"  triton {row['triton_ms']:7.3f}  (err {row['triton_err']:.1e}, compile {row['compile_err']:.1e})")


if __name__ == "__main__":
    main()
