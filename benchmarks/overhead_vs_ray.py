"""Farm's overhead over a hand-written plain Ray program running the same sharded inference on the same cluster.

    python benchmarks/overhead_vs_ray.py [--job embeddings|digits] [--runs 3]

One head and two agents (`--cpus 1` each: this machine has 2 cores) on 127.0.0.1. Each run, alternating A then B:
  A. Farm: what `farm submit SPEC --wait` does, through the Python API: preflight.prepare (loads the model and
     dataset locally, zips the working directory) + Client.submit + Client.watch to the end.
  B. Plain Ray: a Ray driver on the SAME cluster (the head's Ray, with its token: RAY_AUTH_MODE=token,
     RAY_AUTH_TOKEN_PATH=STATE/ray.token, address from head.json), with the repo as runtime_env working_dir,
     one `@ray.remote(num_cpus=1)` task per shard (the same split as Farm's shard_ranges) that loads the same model
     and dataset and runs the same batches with torch threads = the agent's cores, writing one .npy per shard and
     a manifest, like Farm's output.
Both run in a fresh Python subprocess (so B's env is set before `import ray`); the wall time is the subprocess's,
from launch to exit, as a user sees it. Both use `policy: throughput` (a temporary copy of the spec): Farm's
default efficiency policy does not necessarily spread evenly over the two nodes, while plain Ray does (one task per
free CPU), so throughput is the like-for-like comparison. The outputs of A and B are compared at the end.
Target: Farm's wall time within 5% of plain Ray's (median over runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table


from farm.data.results import read_predictions  # noqa: E402
from localfarm import JOBS, ROOT, LocalFarm, report_cleanup  # noqa: E402  (benchmarks/ is the script's path)

TARGET = 1.05

# A: Farm, as `farm submit SPEC --wait` does it (without the progress bar).
FARM_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
from farm.client import Client, find_head
from farm.client.preflight import prepare
t_import = time.perf_counter()
spec, state, root = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
prepared = prepare(spec, root)
t_prepare = time.perf_counter()
with Client(find_head(state_dir=state)) as client:
    job_id = client.submit_prepared(prepared, overwrite=True)  # the same job again
    t_submit = time.perf_counter()
    job = None
    for job in client.watch(job_id):
        pass
t_done = time.perf_counter()
assert job is not None and job.state == "succeeded", (job.state, job.error)
nodes = sorted({s.node_name for s in job.shards})
print(json.dumps({"phases": {"imports": t_import - t0, "prepare (preflight + zip)": t_prepare - t_import,
                             "submit": t_submit - t_prepare, "run (watch to end)": t_done - t_submit},
                  "total": t_done - t0, "nodes": nodes, "job_wall": job.finished_at - job.started_at,
                  "output": job.output}))
"""

# B: a hand-written plain Ray program. Nothing from Farm: the split, the loading and the output are written out here.
RAY_CHILD = r"""
import json, os, sys, time, importlib
t0 = time.perf_counter()
import numpy as np
import ray
t_import = time.perf_counter()
cfg = json.loads(sys.argv[1])


def shard_ranges(items, shards):
    count = min(shards, items)
    base, extra = divmod(items, count)
    ranges, start = [], 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def call(path):
    if os.getcwd() not in sys.path:  # Ray made the working_dir the cwd; the job's modules import from there
        sys.path.insert(0, os.getcwd())
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)()


_cache = {}


def model_and_data(model, weights, dataset):
    # Loaded once per worker process, as a long-lived program would.
    if "model" not in _cache:
        import torch
        module = call(model)
        if weights:
            module.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        data = call(dataset)
        inputs = data[0] if isinstance(data, (tuple, list)) and len(data) == 2 else data
        _cache["model"], _cache["inputs"] = module.eval(), np.asarray(inputs)
    return _cache["model"], _cache["inputs"]


@ray.remote(num_cpus=cfg["cpus"], max_retries=0)
def run_shard(model, weights, dataset, start, stop, batch_size, threads):
    import torch
    torch.set_num_threads(threads)
    module, inputs = model_and_data(model, weights, dataset)
    outputs = []
    with torch.inference_mode():
        for b in range(start, stop, batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(inputs[b : min(b + batch_size, stop)]))
            outputs.append(module(batch).numpy())
    return np.concatenate(outputs), ray.get_runtime_context().get_node_id()


ray.init(address=cfg["address"], runtime_env={"working_dir": cfg["root"], "excludes": cfg["excludes"]},
         log_to_driver=False, logging_level="WARNING")
t_init = time.perf_counter()
out = cfg["output"]
os.makedirs(out, exist_ok=True)
ranges = shard_ranges(cfg["items"], cfg["shards"])
refs = {run_shard.remote(cfg["model"], cfg["weights"], cfg["dataset"], a, b, cfg["batch_size"], cfg["cpus"]): i
        for i, (a, b) in enumerate(ranges)}
pending, nodes, shards = list(refs), set(), []
while pending:
    ready, pending = ray.wait(pending, num_returns=1)
    index = refs[ready[0]]
    outputs, node = ray.get(ready[0])
    nodes.add(node)
    path = os.path.join(out, f"shard-{index:05d}.npy")
    with open(path + ".tmp", "wb") as handle:
        np.save(handle, outputs, allow_pickle=False)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(path + ".tmp", path)
    shards.append({"index": index, "start": ranges[index][0], "stop": ranges[index][1],
                   "file": f"shard-{index:05d}.npy", "node": node})
with open(os.path.join(out, "manifest.json"), "w") as handle:
    json.dump({"items": cfg["items"], "format": "npy", "shards": sorted(shards, key=lambda s: s["index"])}, handle)
t_run = time.perf_counter()
ray.shutdown()
t_done = time.perf_counter()
print(json.dumps({"phases": {"imports": t_import - t0, "ray.init (connect + upload)": t_init - t_import,
                             "run (tasks + outputs)": t_run - t_init, "ray.shutdown": t_done - t_run},
                  "total": t_done - t0, "nodes": sorted(nodes)}))
"""


def read_npy_shards(output: Path) -> np.ndarray:
    """The plain program's outputs (one .npy per shard, as Farm wrote them before its results became Parquet)."""
    manifest = json.loads((output / "manifest.json").read_text())
    parts = sorted(manifest["shards"], key=lambda s: s["start"])
    return np.concatenate([np.load(output / part["file"], allow_pickle=False) for part in parts])

# What the plain program leaves out of its working_dir: the folders Farm's zip leaves out (".?*", not ".*",
# which would match the root itself, "."). Ray also honours the .gitignore (.venv, out, egg-info).
EXCLUDES = [".?*", "venv", "*.egg-info", "__pycache__", "node_modules", "out"]


def run_child(code: str, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=1800, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall"] = wall
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", choices=sorted(JOBS), default="embeddings")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    console = Console(width=130)
    spec = yaml.safe_load((ROOT / JOBS[args.job]).read_text())
    scratch = Path(tempfile.mkdtemp(prefix="farm-bench-overhead-"))
    spec.update(policy="throughput", output=str(scratch / "farm-out"))
    spec_path = scratch / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    from farm.core.spec import parse_spec

    parsed = parse_spec(spec_path.read_text(), str(spec_path))
    results: dict[str, list[dict[str, Any]]] = {"farm": [], "ray": []}
    farms: list[LocalFarm] = []
    try:
        with console.status("starting a head and two agents (--cpus 1 each)..."):
            farm = LocalFarm(agents=2, cpus=1)
            farms.append(farm)
            farm.__enter__()
        try:
            from farm_agent.work.jobcode import load_dataset

            items = len(load_dataset(parsed.dataset, ROOT)[0])
            info = farm.head_json()
            ray_env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}
            # The local farm's Ray listens on loopback only: a driver reaches it in Ray's local-only mode
            # (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0; farm.local.RAY_START_ON_LOOPBACK says why).
            ray_env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(farm.state / "ray.token"),
                           RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
            cfg = {"address": info["ray_address"], "root": str(ROOT), "excludes": EXCLUDES, "cpus": 1,
                   "output": str(scratch / "ray-out"), "items": items, "shards": parsed.shards,
                   "batch_size": parsed.batch_size, "model": parsed.model, "weights": parsed.weights,
                   "dataset": parsed.dataset}
            for run in range(1, args.runs + 1):
                for which in ("farm", "ray"):
                    with console.status(f"run {run}/{args.runs}: {which}..."):
                        shutil.rmtree(scratch / f"{which}-out", ignore_errors=True)
                        if which == "farm":
                            result = run_child(FARM_CHILD, [str(spec_path), str(farm.state), str(ROOT)])
                        else:
                            result = run_child(RAY_CHILD, [json.dumps(cfg)], env=ray_env)
                    results[which].append(result)
                    phases = ", ".join(f"{k} {v:.2f}" for k, v in result["phases"].items())
                    console.print(f"run {run} {which}: {result['wall']:.2f} s on {len(result['nodes'])} node(s) "
                                  f"({phases})", highlight=False)
            diff = float(np.max(np.abs(read_predictions(scratch / "farm-out") - read_npy_shards(scratch / "ray-out"))))
        finally:
            with console.status("stopping the agents and the head..."):
                farm.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    farm_w = [r["wall"] for r in results["farm"]]
    ray_w = [r["wall"] for r in results["ray"]]
    ratio = statistics.median(farm_w) / statistics.median(ray_w)
    table = Table(title=f"{args.job} ({JOBS[args.job]}, policy: throughput, {parsed.shards} shards of {items} items, "
                        f"2 agents x 1 CPU): wall time over {args.runs} runs, alternating Farm / Ray")
    for column in ("", "median s", "min s", "max s", "runs (s)", "nodes used"):
        table.add_column(column, justify="left" if not column else "right")
    for label, walls, key in (("Farm (prepare + submit + watch)", farm_w, "farm"),
                              ("plain Ray (driver, same cluster)", ray_w, "ray")):
        nodes = max(len(r["nodes"]) for r in results[key])
        table.add_row(label, f"{statistics.median(walls):.2f}", f"{min(walls):.2f}", f"{max(walls):.2f}",
                      ", ".join(f"{w:.2f}" for w in walls), str(nodes))
    met = "[green]met[/]" if ratio <= TARGET else "[red]missed[/]"
    table.add_row("Farm / Ray", f"{ratio:.3f}", "", "", f"target <= {TARGET:.2f}: {met}", "")
    # Without the client side (Farm's local preflight, each side's imports and interpreter exit): what the cluster
    # part costs, Farm's submit + run against Ray's init + run + shutdown.
    farm_c = statistics.median(r["phases"]["submit"] + r["phases"]["run (watch to end)"] for r in results["farm"])
    ray_c = statistics.median(sum(v for k, v in r["phases"].items() if k != "imports") for r in results["ray"])
    table.add_row("Farm / Ray, cluster part only", f"{farm_c / ray_c:.3f}", "", "",
                  f"{farm_c:.2f} s / {ray_c:.2f} s", "")
    console.print(table)

    phases = Table(title="Where the time goes (median per phase, seconds, inside each subprocess)")
    phases.add_column("side")
    phases.add_column("phase")
    phases.add_column("median s", justify="right")
    for key, label in (("farm", "Farm"), ("ray", "plain Ray")):
        for phase in results[key][0]["phases"]:
            phases.add_row(label, phase, f"{statistics.median(r['phases'][phase] for r in results[key]):.2f}")
        startup = statistics.median(r["wall"] - r["total"] for r in results[key])
        phases.add_row(label, "interpreter start + exit", f"{startup:.2f}")
    phases.add_row("Farm", "(head's job wall: first shard start to finish)",
                   f"{statistics.median(r['job_wall'] for r in results['farm']):.2f}")
    console.print(phases)
    console.print(f"outputs: max |Farm - Ray| over the joined arrays = {diff:.3g}")
    report_cleanup(console, farms)


if __name__ == "__main__":
    main()

