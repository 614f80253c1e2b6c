"""Every template region of every problem, compiled and checked on this GPU, in parallel processes.

    python benchmarks/kernels/template_check.py benchmarks/kernels/problems [--workers 8] [--time-limit-s 170]
        [--precisions ieee tf32x3 tf32] [--no-compile-warm] [--out check.json]

For each problem: the matcher's rewrite at each precision, run once on the problem's inputs (this compiles the
template kernels and runs their autotuning), its relative norm error against the eager fp32 output, the regions
found and any template that failed to compile (the region then ran in PyTorch: recorded, never fatal); then, unless
--no-compile-warm, torch.compile of the model run once. Both compilers keep what they built on disk (Triton's cache,
Inductor's FX graph cache), so the timed run that follows (tune_h200.py, one problem at a time) measures candidates
whose compilation is already done. Timings here are not measured: the processes share the GPU.

A problem that crashes its worker or runs past the time limit is recorded as such; the rest go on.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]


def check_problem(path: str, precisions: list[str], compile_warm: bool, device: str = "cuda") -> dict[str, Any]:
    """One problem's template check (in a worker process)."""
    import torch

    from farm_agent.tuner.candidates import _tf32
    from farm_agent.tuner.problem import load_problem
    from farm_agent.tuner.templates import codegen
    from farm_agent.tuner.templates.matcher import regions, rewrite

    started = time.perf_counter()
    result: dict[str, Any] = {"problem": Path(path).stem, "precisions": {}}
    try:
        problem = load_problem(path)
        model = problem.model(device)
        inputs = problem.inputs(device, seed=0)
        with torch.no_grad(), _tf32(False):
            ref = model(*inputs)
        refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
        for precision in precisions:
            before = dict(codegen.FAILURES)
            t0 = time.perf_counter()
            entry: dict[str, Any] = {}
            try:
                rewritten, counts = rewrite(model, inputs, precision)
                entry["regions"] = dict(counts)
                if not counts:
                    continue
                entry["described"] = [r.describe() for r in regions(rewritten)]
                with torch.no_grad(), _tf32(False):
                    out = rewritten(*inputs)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                outs = list(out) if isinstance(out, (tuple, list)) else [out]
                entry["rel_norm_err"] = max(float((o.double() - r.double()).norm() / r.double().norm().clamp_min(1e-30))
                                            for o, r in zip(outs, refs, strict=True))
                entry["failed_regions"] = [r.describe() for r in regions(rewritten) if r.failed]
                entry["failures"] = {k: v for k, v in codegen.FAILURES.items() if k not in before}
                del rewritten, out, outs
            except Exception as exc:  # noqa: BLE001 - recorded per problem and precision
                entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
                entry["traceback"] = traceback.format_exc()[-2000:]
            entry["seconds"] = time.perf_counter() - t0
            result["precisions"][precision] = entry
        if compile_warm:
            t0 = time.perf_counter()
            try:
                torch._dynamo.reset()
                with torch.no_grad():
                    torch.compile(model)(*inputs)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                result["compile_warm_s"] = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001
                result["compile_warm_error"] = f"{type(exc).__name__}: {exc}"[:500]
    except Exception as exc:  # noqa: BLE001
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
    result["seconds"] = time.perf_counter() - started
    return result


def _work(args: tuple[str, list[str], bool, str]) -> dict[str, Any]:
    return check_problem(*args)


def check_all(paths: list[Path], precisions: list[str], workers: int, time_limit_s: float,
              compile_warm: bool = True, device: str = "cuda") -> dict[str, Any]:
    """Every problem's check, `workers` at a time; what is left when the time limit comes is recorded as not run."""
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    context = multiprocessing.get_context("spawn")  # each worker its own CUDA context
    pool = context.Pool(processes=max(1, workers), maxtasksperchild=4)
    try:
        pending = pool.imap_unordered(_work, [(str(p), precisions, compile_warm, device) for p in paths])
        for _ in paths:
            left = time_limit_s - (time.perf_counter() - started)
            if left <= 0:
                break
            try:
                result = pending.next(timeout=left)
            except multiprocessing.TimeoutError:
                break
            results[result["problem"]] = result
            kinds = {p: e.get("regions") for p, e in result["precisions"].items()}
            bad = {p: e.get("error") or e.get("failed_regions") for p, e in result["precisions"].items()
                   if e.get("error") or e.get("failed_regions")}
            print(f"check {result['problem']}: {kinds} {result['seconds']:.0f} s"
                  + (f" FAILED {bad}" if bad else "") + (f" ERROR {result['error']}" if "error" in result else ""),
                  flush=True)
    finally:
        pool.terminate()
        pool.join()
    for p in paths:
        results.setdefault(p.stem, {"problem": p.stem, "error": "not checked: time limit or worker died"})
    return {"wall_s": time.perf_counter() - started, "precisions": precisions, "workers": workers,
            "problems": results}


def main() -> None:
    from farm_agent.tuner.problem import problem_paths

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--time-limit-s", type=float, default=170.0)
    parser.add_argument("--precisions", nargs="+", default=["ieee", "tf32x3", "tf32"])
    parser.add_argument("--no-compile-warm", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu: the kernels under TRITON_INTERPRET=1, or PyTorch")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    paths = [p for folder in args.problems for p in problem_paths(folder)]
    data = check_all(paths, args.precisions, args.workers, args.time_limit_s, not args.no_compile_warm, args.device)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
