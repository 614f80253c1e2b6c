"""Where a candidate's time goes beyond its kernels: each problem's eager, compile-default and template candidates
(the template's launches through Triton every time, and through codegen.Launcher's direct path) timed three ways.

    python benchmarks/kernels/call_overhead.py benchmarks/kernels/problems/layer_norm.py [...] [--profile]

'stream ms': triton.testing.do_bench (calls back to back: the host's launch work hidden behind the GPU's);
'idle ms': as the evaluator times (worker.py): the cache flushed, the device idle, events around one call, median
of 20 (the host's work before the first kernel counts); 'host us': the host's time a call, 20 calls back to back
with no sync. --profile: the template candidate's costliest functions over 1000 calls (cProfile, by own time).
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]

from farm_agent.tuner import candidates  # noqa: E402
from farm_agent.tuner.problem import load_problem  # noqa: E402
from farm_agent.tuner.templates import codegen  # noqa: E402


def idle_ms(fn, inputs, flush: torch.Tensor) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(20):
        flush.zero_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*inputs)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_us(fn, inputs, calls: int = 20) -> float:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    host = (time.perf_counter() - started) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main() -> int:
    import triton.testing

    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    flush = torch.empty(256 * 1024 * 1024 // 4, device="cuda")
    print(f"{'problem':28} {'candidate':24} {'stream ms':>10} {'idle ms':>9} {'host us':>8} {'max err':>9}")
    for path in paths:
        problem = load_problem(path)
        model = problem.model("cuda")
        inputs = problem.inputs("cuda", 0)
        with torch.no_grad():
            want = model(*inputs)
        for name, fast in (("eager", True), ("compile-default", True), ("triton-templates", False),
                           ("triton-templates", True)):
            codegen.FAST_LAUNCH = fast
            label = name + ("" if fast or name != "triton-templates" else " (via Triton)")
            try:
                fn = candidates.build(name, model, inputs, {})
                for _ in range(3):
                    fn(*inputs)
                torch.cuda.synchronize()
                stream = triton.testing.do_bench(lambda: fn(*inputs), warmup=25, rep=200)
                idle = idle_ms(fn, inputs, flush)
                host = host_us(fn, inputs)
                with torch.no_grad():
                    error = (fn(*inputs) - want).abs().max().item()
            except Exception as exc:  # noqa: BLE001 - a candidate that does not build is a row of the table
                print(f"{problem.name:28} {label:24} failed: {' '.join(str(exc).split())[:100]}")
                continue
            print(f"{problem.name:28} {label:24} {stream:10.3f} {idle:9.3f} {host:8.1f} {error:9.2e}", flush=True)
            if "--profile" in sys.argv and name == "triton-templates":
                profiler = cProfile.Profile()
                for _ in range(50):  # 1000 calls (pstats prints milliseconds), the launch queue drained every 20
                    profiler.enable()
                    for _ in range(20):
                        fn(*inputs)
                    profiler.disable()
                    torch.cuda.synchronize()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
        del model, inputs, want
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
