"""The host's cost of one call of a template candidate, and where it goes (cProfile), against eager and
torch.compile: the evaluator times a call from an idle device, so the host's work before the first kernel counts.

    python benchmarks/kernels/launch_cost.py benchmarks/kernels/problems/layer_norm.py

Prints each candidate's host microseconds a call (200 calls back to back, no sync between them), then the
template candidate's 25 costliest functions by their own time.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]

from farm_agent.tuner import candidates  # noqa: E402
from farm_agent.tuner.problem import load_problem  # noqa: E402


def host_us(fn, inputs, calls: int = 200) -> float:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    host = (time.perf_counter() - started) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main() -> int:
    for path in sys.argv[1:]:
        problem = load_problem(path)
        model = problem.model("cuda")
        inputs = problem.inputs("cuda", 0)
        for name in ("eager", "compile-default", "triton-templates"):
            fn = candidates.build(name, model, inputs, {})
            for _ in range(3):
                fn(*inputs)
            print(f"{problem.name:24} {name:18} host {host_us(fn, inputs, 20):8.1f} us a call", flush=True)
            if name == "triton-templates":
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(20):
                    fn(*inputs)
                profiler.disable()
                torch.cuda.synchronize()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
