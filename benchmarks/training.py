"""Training: time and energy to the target accuracy on one and two agents, and speed-proportional batches against
equal ones on a heterogeneous pair.

    python benchmarks/training.py [--target 0.95] [--steps 120]

Part 1: `examples/digits/train.yaml` (sync, global batch 64, 8 epochs, a checkpoint and an eval every 40 steps here
every 10) through a real head and real agents (each `--cpus 1`: this machine has 2 cores), with `workers: 1` on one
agent and `workers: 2` on two. Time to target = from the job's start to the end of the first stretch whose eval
accuracy reaches --target (the head's log timestamps); energy to target = the stretches' energy up to it.

Part 2: two TrainWorker actors in a real collective group (gloo) on a local Ray, sync mode, global batch 64. One
worker runs the digits CNN as it is; the other the same CNN through a wrapper that runs it four times, forward and
backward, adding the three extra passes times zero (same parameters, outputs and gradients, 4x the work): a pair
where one device is 4x slower. For `--steps`
steps: the batch split 32/32 against the split the driver makes from the workers' probed speeds.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import yaml
from rich.console import Console
from rich.table import Table

from farm.client import Client

from localfarm import ROOT, LocalFarm, report_cleanup  # noqa: E402  (benchmarks/ is the script's path)

SLOW_MODEL = '''"""The digits CNN computing every forward pass 4 times: a device 4x slower, with identical results."""
import torch
from examples.digits.model import build


class FourTimes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = build()

    def forward(self, x):
        y = self.inner(x)
        for _ in range(3):  # 3 more passes, forward and backward, that add exactly nothing (0 x, 0 gradient)
            y = y + 0.0 * self.inner(x)
        return y


def slow():
    torch.manual_seed(0)
    return FourTimes()


def fast():
    torch.manual_seed(0)
    return FourTimes().inner  # the very same initial parameters as slow()'s
'''


def time_to_target(farm: LocalFarm, spec_path: Path, target: float) -> dict[str, Any]:
    from farm.client.preflight import prepare

    prepared = prepare(spec_path, ROOT)
    assert farm.head is not None
    with Client(farm.head) as client:
        job_id = client.submit_prepared(prepared, overwrite=True)  # the same job again
        job = None
        for job in client.watch(job_id):
            pass
        if job is None or job.state != "succeeded":
            raise RuntimeError(f"job {job_id} ended {job.state if job else '?'}: {job.error if job else ''}")
        lines = client.logs(job_id)
    reached, energy = None, 0.0
    stretches = iter(job.shards)
    for line in lines:
        if not line.message.startswith("steps "):
            continue
        energy += next(stretches).energy_j
        accuracy = float(line.message.rsplit("accuracy ", 1)[1]) if "accuracy " in line.message else 0.0
        if accuracy >= target:
            reached = line.ts - job.started_at
            break
    return {"wall": job.finished_at - job.started_at, "to_target_s": reached, "to_target_j": energy if reached else None,
            "accuracy": job.metrics["accuracy"], "energy": job.energy_j, "source": ", ".join(job.energy_sources)}


def heterogeneous_pair(steps: int) -> list[dict[str, Any]]:
    from farm.scheduler.training import batch_shares
    from farm_agent.work.kinds.training import TrainWorker

    work = Path(tempfile.mkdtemp(prefix="farm-bench-train-"))
    shutil.copytree(ROOT / "examples" / "digits", work / "examples" / "digits",
                    ignore=shutil.ignore_patterns("__pycache__", "weights.pt"))
    (work / "examples" / "__init__.py").touch()
    (work / "slowdigits.py").write_text(SLOW_MODEL)
    spec = yaml.safe_load((ROOT / "examples/digits/train.yaml").read_text())
    spec["training"].update(seed=0)
    fast_spec = yaml.safe_dump({**spec, "model": "slowdigits:fast"})
    slow_spec = yaml.safe_dump({**spec, "model": "slowdigits:slow"})
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"working_dir": str(work)})
    rows = []
    try:
        actor = ray.remote(num_cpus=1)(TrainWorker)
        for label, split in (("equal 32/32", None), ("by measured speed", "probe")):
            group = f"bench-{len(rows)}"
            workers = [actor.remote(s, "bench", rank, 2, group, "cpu", 1, None)
                       for rank, s in enumerate((fast_spec, slow_spec))]
            ray.get([w.join.remote() for w in workers])
            speeds = ray.get([w.probe.remote(32) for w in workers])
            shares = batch_shares(64, speeds) if split else [32, 32]
            began = time.perf_counter()
            results = ray.get([w.train.remote(0, steps, shares) for w in workers])
            wall = time.perf_counter() - began
            rows.append({"split": label, "shares": shares, "speeds": speeds, "wall": wall,
                         "samples_per_s": 64 * steps / wall, "final_loss": results[0]["losses"][-1],
                         "idle": [1 - r["compute_s"] / r["seconds"] for r in results]})
            for w in workers:
                ray.kill(w)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()
    console = Console(width=140)

    scratch = Path(tempfile.mkdtemp(prefix="farm-bench-training-"))
    runs, farms = {}, []
    for agents in (1, 2):
        spec = yaml.safe_load((ROOT / "examples/digits/train.yaml").read_text())
        spec["training"].update(workers=agents, checkpoint_every=10)
        spec.update(output=str(scratch / f"out-{agents}"), backends=["cpu"])
        spec_path = scratch / f"train-{agents}.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        with LocalFarm(agents=agents, cpus=1) as farm:
            runs[agents] = time_to_target(farm, spec_path, args.target)
        farms.append(farm)
    report_cleanup(console, farms)
    table = Table(title=f"digits CNN to {args.target:.0%} test accuracy (sync, global batch 64, 157 steps)",
                  title_justify="left")
    for column in ("agents", "to target s", "to target J", "whole job s", "whole job J", "final accuracy"):
        table.add_column(column, justify="right")
    for agents, r in runs.items():
        table.add_row(str(agents), f"{r['to_target_s']:.1f}" if r["to_target_s"] else "not reached",
                      f"{r['to_target_j']:.1f}" if r["to_target_j"] else "-", f"{r['wall']:.1f}",
                      f"{r['energy']:.1f} ({r['source']})", f"{r['accuracy']:.2%}")
    console.print(table)

    rows = heterogeneous_pair(args.steps)
    table = Table(title=f"a 4x slower partner, sync, global batch 64, {args.steps} steps", title_justify="left")
    for column in ("split", "shares fast/slow", "probed samples/s", "wall s", "samples/s", "idle fast/slow",
                   "final loss"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["split"], "/".join(map(str, r["shares"])), " / ".join(f"{s:,.0f}" for s in r["speeds"]),
                      f"{r['wall']:.2f}", f"{r['samples_per_s']:,.0f}", " / ".join(f"{i:.0%}" for i in r["idle"]),
                      f"{r['final_loss']:.4f}")
    console.print(table)
    console.print(f"speed-proportional / equal: {rows[1]['samples_per_s'] / rows[0]['samples_per_s']:.2f}x samples/s")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
