"""Where a candidate's time goes beyond its kernels: each problem's eager, compile-default and template candidates
timed two ways, and the template's kernels listed.

    python benchmarks/kernels/call_overhead.py benchmarks/kernels/problems/layer_norm.py [...]

'stream ms': triton.testing.do_bench (calls back to back: the host's launch work hidden behind the GPU's);
'idle ms': as the evaluator times (worker.py): the cache flushed, the device idle, events around one call, median
of 20 (the host's work before the first kernel counts); 'host ms': the call's own time on the host, no sync.
Then the template's CUDA kernels (torch.profiler), to show copies or extra kernels a region launches.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]

from farm_agent.tuner import candidates  # noqa: E402
from farm_agent.tuner.problem import load_problem  # noqa: E402


def idle_ms(fn, inputs, flush: torch.Tensor) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    times, host = [], []
    for _ in range(20):
        flush.zero_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn(*inputs)
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), statistics.median(host)


def main() -> int:
    import triton.testing
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 * 1024 * 1024 // 4, device="cuda")
    print(f"{'problem':28} {'candidate':20} {'stream ms':>10} {'idle ms':>9} {'host ms':>8}")
    for path in sys.argv[1:]:
        problem = load_problem(path)
        model = problem.model("cuda")
        inputs = problem.inputs("cuda", 0)
        for name in ("eager", "compile-default", "triton-templates"):
            try:
                fn = candidates.build(name, model, inputs, {})
                fn = getattr(fn, "fn", fn)
                for _ in range(3):
                    fn(*inputs)
                torch.cuda.synchronize()
                stream = triton.testing.do_bench(lambda: fn(*inputs), warmup=25, rep=200)
                idle, host = idle_ms(fn, inputs, flush)
            except Exception as exc:  # noqa: BLE001 - a candidate that does not build is a row of the table
                print(f"{problem.name:28} {name:20} failed: {' '.join(str(exc).split())[:100]}")
                continue
            print(f"{problem.name:28} {name:20} {stream:10.3f} {idle:9.3f} {host:8.3f}", flush=True)
            if name == "triton-templates":
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    fn(*inputs)
                    torch.cuda.synchronize()
                for event in prof.key_averages():
                    if event.device_time_total > 0 or event.cpu_time_total > 50:
                        print(f"    {event.key[:70]:70} cpu {event.cpu_time_total / 1e3:7.3f} ms "
                              f"gpu {event.device_time_total / 1e3:7.3f} ms x{event.count}")
        del model, inputs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
