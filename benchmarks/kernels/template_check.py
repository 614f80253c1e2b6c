"""Every template region of every problem, compiled and checked on this GPU, in parallel processes.

    python benchmarks/kernels/template_check.py benchmarks/kernels/problems [--workers 8] [--time-limit-s 170]
        [--precisions ieee tf32x3 tf32] [--no-compile-warm] [--out check.json]

For each problem: the matcher's rewrite at each precision, run once on the problem's inputs (this compiles the
template kernels and runs their autotuning), its relative norm error against the eager fp32 output, the regions
found and any template that failed to compile (the region then ran in PyTorch: recorded, never fatal); then, unless
--no-compile-warm, torch.compile of the model run once. Both compilers keep what they built on disk (Triton's cache,
Inductor's FX graph cache), so the timed run that follows (tune_h200.py, one problem at a time) measures candidates
whose compilation is already done. Timings here are not measured: the processes share the GPU.

A task that crashes its worker is recorded as an error, one not done in the time limit as missing (tune_h200.py
then leaves that problem's template family out); the rest go on.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
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
                if "CUDA" in str(exc) or "cuda" in type(exc).__name__.lower():  # the context may be unusable now
                    result["cuda_broken"] = True
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


def _worker(tasks: Any, results: Any) -> None:
    """A check process: tasks (index, args) until a None; it leaves after a task that broke its CUDA context, and
    the parent starts another."""
    while True:
        item = tasks.get()
        if item is None:
            return
        index, args = item
        results.put(("start", index, os.getpid()))
        result = check_problem(*args)
        results.put(("done", index, result))
        if result.get("cuda_broken"):
            return


def check_all(paths: list[Path], precisions: list[str], workers: int, time_limit_s: float,
              compile_warm: bool = True, device: str = "cuda") -> dict[str, Any]:
    """Every problem's check, `workers` tasks at a time: one task per (problem, precision), so that one model's many
    compiles spread over the workers, then one torch.compile warm-up per problem. Tasks start in the order of
    `paths` (put the heaviest first). A task whose process dies is recorded as an error and the process replaced;
    what is left when the time limit comes is recorded as not done. A task that ran out of GPU memory beside the
    others (its templates then fell back to PyTorch, and the timed run left that family out) is run again alone."""
    started = time.perf_counter()
    deadline = started + time_limit_s
    tasks = [(str(p), [precision], False, device) for p in paths for precision in precisions]
    if compile_warm:
        tasks += [(str(p), [], True, device) for p in paths]
    done = _run_tasks(tasks, workers, deadline)
    again = [i for i, result in done.items() if workers > 1 and out_of_memory(result)]
    if again:
        print(f"check: {len(again)} tasks ran out of GPU memory beside the others; again, one at a time", flush=True)
        redone = _run_tasks([tasks[i] for i in again], 1, deadline)
        done.update({again[j]: result for j, result in redone.items()})
    results: dict[str, dict[str, Any]] = {p.stem: {"problem": p.stem, "precisions": {}, "seconds": 0.0}
                                          for p in paths}
    for index in sorted(done):
        _merge(results[Path(tasks[index][0]).stem], done[index])
    if len(done) < len(tasks):
        print(f"check: {len(tasks) - len(done)} of {len(tasks)} tasks not done in {time_limit_s:g} s", flush=True)
    return {"wall_s": time.perf_counter() - started, "precisions": precisions, "workers": workers,
            "tasks": len(tasks), "tasks_done": len(done), "retried_alone": len(again), "problems": results}


def out_of_memory(result: dict[str, Any]) -> bool:
    """Whether a task's check failed for want of GPU memory, anywhere (the problem, a precision, a template)."""
    said = [result.get("error", ""), *(str(e.get("error", "")) + str(e.get("failures", ""))
                                       for e in result.get("precisions", {}).values())]
    return any("out of memory" in text.lower() for text in said)


def workers_for(free_bytes: int, asked: int, per_worker_bytes: int) -> int:
    """How many check processes the GPU's free memory holds, each with its own CUDA context and problem: at most
    `asked`, at least one."""
    return max(1, min(asked, free_bytes // max(per_worker_bytes, 1)))


def _run_tasks(tasks: list[tuple[str, list[str], bool, str]], workers: int, deadline: float
               ) -> dict[int, dict[str, Any]]:
    """Run tasks on `workers` processes until done or `deadline`; each finished task's result by its index."""
    context = multiprocessing.get_context("spawn")  # each process its own CUDA context
    task_queue, result_queue = context.Queue(), context.Queue()
    for item in enumerate(tasks):
        task_queue.put(item)
    for _ in range(workers):
        task_queue.put(None)
    processes = [context.Process(target=_worker, args=(task_queue, result_queue), daemon=True)
                 for _ in range(max(1, workers))]
    for process in processes:
        process.start()
    running: dict[int, int] = {}  # pid -> task index
    done: dict[int, dict[str, Any]] = {}
    begun = 0
    try:
        while len(done) < len(tasks) and time.perf_counter() < deadline:
            try:
                kind, index, payload = result_queue.get(timeout=1.0)
            except queue.Empty:
                kind = ""
            if kind == "start":
                running[payload] = index
                begun += 1
            elif kind == "done" and index not in done:
                running = {pid: i for pid, i in running.items() if i != index}
                done[index] = payload
            for process in list(processes):
                if process.is_alive() or process.exitcode is None:
                    continue
                processes.remove(process)
                lost = running.pop(process.pid or -1, None)
                if lost is not None and lost not in done:  # died inside a task: an error, not a wait
                    path, task_precisions = tasks[lost][0], tasks[lost][1]
                    error = f"check process died (exit code {process.exitcode})"
                    done[lost] = {"problem": Path(path).stem, "seconds": 0.0,
                                  "precisions": {p: {"error": error} for p in task_precisions}}
                    print(f"check {Path(path).stem} {task_precisions}: {error}", flush=True)
                if begun < len(tasks):
                    task_queue.put(None)  # the replacement's own end-of-tasks mark
                    replacement = context.Process(target=_worker, args=(task_queue, result_queue), daemon=True)
                    replacement.start()
                    processes.append(replacement)
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            process.join(timeout=10)
    return done


def _merge(merged: dict[str, Any], result: dict[str, Any]) -> None:
    merged["precisions"].update(result["precisions"])
    merged["seconds"] += result["seconds"]
    for key in ("compile_warm_s", "compile_warm_error", "error"):
        if key in result:
            merged[key] = result[key]
    for precision, e in result["precisions"].items():
        bad = e.get("error") or e.get("failed_regions")
        print(f"check {result['problem']} {precision}: {e.get('regions')} {e.get('seconds', 0):.0f} s"
              + (f" FAILED {bad}" if bad else ""), flush=True)
    if "error" in result:
        print(f"check {result['problem']}: ERROR {result['error']}", flush=True)


WORKER_MEMORY_GIB = 8.0


def sized_workers(asked: int, worker_memory_gib: float = WORKER_MEMORY_GIB, device: str = "cuda") -> int:
    """`asked` check processes, fewer where this GPU's free memory holds fewer (on the CPU: as asked)."""
    if not device.startswith("cuda"):
        return max(1, asked)
    import torch

    free, _ = torch.cuda.mem_get_info()
    workers = workers_for(free, asked, int(worker_memory_gib * (1 << 30)))
    if workers < asked:
        print(f"check: {workers} processes, not {asked}: {free / (1 << 30):.0f} GiB free on the GPU holds "
              f"{workers} at {worker_memory_gib:g} GiB each", flush=True)
    return workers


def main() -> None:
    from farm_agent.tuner.problem import problem_paths

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                        help="at most this many processes; fewer where the GPU's free memory holds fewer")
    parser.add_argument("--worker-memory-gib", type=float, default=WORKER_MEMORY_GIB,
                        help="GPU memory one check process may need (its CUDA context, the problem, compiles)")
    parser.add_argument("--time-limit-s", type=float, default=170.0)
    parser.add_argument("--precisions", nargs="+", default=["ieee", "tf32x3", "tf32"])
    parser.add_argument("--no-compile-warm", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu: the kernels under TRITON_INTERPRET=1, or PyTorch")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    paths = [p for folder in args.problems for p in problem_paths(folder)]
    workers = sized_workers(args.workers, args.worker_memory_gib, args.device)
    data = check_all(paths, args.precisions, workers, args.time_limit_s, not args.no_compile_warm, args.device)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
