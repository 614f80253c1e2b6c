"""What the data-plane benchmarks share: their datasets, a Farm job over one, and what its Ray workers spent.

The workers' CPU time is turned into joules by the same model Farm's CPU meter uses where there is no RAPL
(farm_agent.power.estimate: rated package watts / logical cores per busy core-second), so both sides of a comparison
are billed alike; the figure is a model estimate and says so.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from farm.client import Client

from localfarm import ROOT, LocalFarm  # noqa: E402  (benchmarks/ is the script's path)

MiB = 1024 * 1024


def ensure_dataset(folder: Path, rows: int) -> Path:
    """`rows` rows of benchmarks/pixels.py's dataset in `folder`, written unless already there."""
    marker = folder / "_ROWS"  # `_`-prefixed: pyarrow's dataset layer skips it
    if marker.exists() and marker.read_text() == str(rows):
        return folder
    from pixels import write_dataset

    shutil.rmtree(folder, ignore_errors=True)
    write_dataset(folder, rows)
    marker.write_text(str(rows))
    return folder


def is_ray_worker(proc: psutil.Process) -> bool:
    try:
        return any("default_worker" in a or a.startswith("ray::") for a in proc.cmdline())
    except psutil.Error:
        return False


class WorkerSampler:
    """Every Ray worker process under the given raylets, sampled every 0.2 s: its peak RSS, and its CPU seconds
    (user + system) from the first sample to the last."""

    def __init__(self, raylets: dict[int, str]) -> None:
        self.raylets = raylets  # raylet pid -> agent name
        self.peak: dict[int, tuple[str, int]] = {}  # worker pid -> (agent, peak RSS bytes)
        self.cpu: dict[int, list[float]] = {}  # worker pid -> [CPU seconds at its first sample, at its last]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WorkerSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def cpu_seconds(self) -> float:
        return sum(last - first for first, last in self.cpu.values())

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def _sample(self) -> None:
        for raylet, agent in self.raylets.items():
            try:
                children = psutil.Process(raylet).children()
            except psutil.Error:
                continue
            for child in children:
                if not is_ray_worker(child):
                    continue
                try:
                    with child.oneshot():
                        rss = child.memory_info().rss
                        times = child.cpu_times()
                except psutil.Error:
                    continue
                self.peak[child.pid] = (agent, max(rss, self.peak.get(child.pid, ("", 0))[1]))
                busy = times.user + times.system
                self.cpu.setdefault(child.pid, [busy, busy])[1] = busy


def raylets_of(farm: LocalFarm) -> dict[int, str]:
    """The raylet of each agent's Ray node, by pid, with the agent's name."""
    found = {}
    for status in farm.agent_status():
        pid = int(status.get("ray_pid", 0))
        try:
            for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                if "raylet" in proc.name():
                    found[proc.pid] = str(status.get("name", "?"))
        except psutil.Error:
            continue
    return found


def farm_job(farm: LocalFarm, data: Path, out: Path, batch_size: int, scratch: Path, name: str,
             shards: str | int = "auto") -> dict[str, Any]:
    """The pixels model over a Parquet folder as a Farm job (cpu, policy throughput); its figures as the client saw
    them, and its workers' peak memory and CPU time."""
    from farm.client.preflight import prepare

    assert farm.head is not None
    spec = {"name": name, "kind": "inference", "model": "benchmarks.pixels:build",
            "dataset": {"location": str(data), "format": "parquet", "inputs": ["pixels"], "label": "label"},
            "shards": shards, "batch_size": batch_size, "backends": ["cpu"], "policy": "throughput",
            "output": str(out)}
    path = scratch / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    prepared = prepare(path, ROOT)
    with WorkerSampler(raylets_of(farm)) as sampler, Client(farm.head) as client:
        began = time.perf_counter()
        job_id = client.submit_prepared(prepared)
        job = None
        for job in client.watch(job_id):
            pass
        wall = time.perf_counter() - began
    if job is None or job.state != "succeeded":
        raise RuntimeError(f"job {job_id} ended {job.state if job else '?'}: {job.error if job else ''}")
    return {"id": job_id, "rows": job.items, "wall": wall, "job_wall": job.finished_at - job.started_at,
            "shards": len(job.shards), "energy_j": job.energy_j,
            "marginal_j": getattr(job, "marginal_j", 0.0), "peak": dict(sampler.peak),
            "cpu_seconds": sampler.cpu_seconds,
            "sizes": [(s.node_name, s.stop - s.start) for s in sorted(job.shards, key=lambda s: s.start)]}


def watts_per_core() -> float:
    """Farm's CPU model: rated package watts (FARM_CPU_RATED_W, else 10 W a core up to 150 W) per logical core."""
    from farm_agent.power.estimate import default_rated_watts

    cores = psutil.cpu_count(logical=True) or 1
    return default_rated_watts(cores) / cores
