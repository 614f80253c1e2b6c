"""What the dashboard shows, as JSON-ready data built from the store's records. Pure: no I/O.

Every power and energy figure keeps its source and scope; `estimate` says whether the page marks it "est." (anything
but a hardware counter), so that estimates are shown as estimates.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import yaml

from farm.core.energy import EnergySource
from farm.core.models import BackendOffer, GpuMemory, JobState, Node, NodeState, Shard, ShardState, cpu_split
from farm.core.phases import ShardPhases, before_text
from farm.head.store import Job, NodeWork
from farm.head.store.retries import PAUSED

JSON = dict[str, Any]
LIVE_STATES = (NodeState.JOINING, NodeState.READY, NodeState.DRAINING)


def is_estimate(source: str) -> bool:
    """A figure that no hardware counter measured. An empty source means no figure at all: nothing to mark."""
    return bool(source) and source != EnergySource.COUNTER


def combined_source(sources: Iterable[str]) -> str:
    """One source for a sum of figures: theirs when they agree, else "mixed" (marked as an estimate when any is)."""
    found = {s for s in sources if s}
    if not found:
        return ""
    return found.pop() if len(found) == 1 else "mixed"


def _mixed_estimate(sources: Iterable[str]) -> bool:
    return any(is_estimate(s) for s in sources)


def activity(node: Node, shards_running: int) -> str:
    """What a live node is doing: its owner needs it (busy), it runs Farm's shards (working), or it waits (idle)."""
    if node.state is NodeState.OFFLINE:
        return "offline"
    if node.busy:
        return "busy"
    return "working" if shards_running else "idle"


def running_shards_by_node(running_jobs: Iterable[Job]) -> Counter[str]:
    return Counter(s.node_id for job in running_jobs for s in job.shards if s.state is ShardState.RUNNING)


def gpu_memory_percent(memory: Iterable[GpuMemory]) -> float:
    """The node's GPUs' memory in use, together, in percent; NaN where it reported none (no GPU, no NVML)."""
    used = total = 0
    for m in memory:
        used, total = used + m.used_bytes, total + m.total_bytes
    return 100.0 * used / total if total else math.nan


def running_jobs_by_node(running_jobs: Iterable[Job]) -> defaultdict[str, list[JSON]]:
    """Each node's jobs with a shard running there now: id and name, in the jobs' order."""
    jobs: defaultdict[str, list[JSON]] = defaultdict(list)
    for job in running_jobs:
        for node_id in dict.fromkeys(s.node_id for s in job.shards if s.state is ShardState.RUNNING):
            jobs[node_id].append({"id": job.id, "name": job.name})
    return jobs


def idle_draw(offer: BackendOffer) -> JSON:
    """A backend's idle draw as the page shows it. An estimate of 0 W is no reading (an estimate counts work only, so
    its idle is 0 by construction): it is shown as not metered, with why, rather than as a meter reading 0."""
    if not offer.idle_source or offer.idle_w is None:
        return {"idle_w": None, "idle_source": "", "idle_estimate": False, "idle_unmetered": ""}
    if is_estimate(offer.idle_source) and offer.idle_w <= 0:
        return {"idle_w": None, "idle_source": offer.idle_source, "idle_estimate": True,
                "idle_unmetered": f"not metered: this device's power is a {offer.idle_source}, which gives no "
                                  "idle draw"}
    return {"idle_w": offer.idle_w, "idle_source": offer.idle_source, "idle_estimate": is_estimate(offer.idle_source),
            "idle_unmetered": ""}


def node_view(node: Node, shards_running: int, work: list[NodeWork], models: Iterable[JSON] = (),
              jobs: Iterable[JSON] = ()) -> JSON:
    """A node's figures and the jobs running on it (`jobs`: running_jobs_by_node's). Its perf/W is per model
    (`models`, perf_by_model for this node), never one figure over the models it ran."""
    power_w = sum(p.watts for p in node.power)
    owner_cpu, farm_cpu = cpu_split(node)
    power_sources = [p.source.value for p in node.power]
    items = sum(w.items for w in work)
    energy_j = sum(w.energy_j for w in work)
    energy_sources = [w.energy_source for w in work if w.energy_source]
    marginal_j = _marginal([w for w in work if w.energy_source])
    return {
        "id": node.id, "name": node.name, "state": node.state.value, "activity": activity(node, shards_running),
        "busy": node.busy, "drain": node.drain,
        "backends": [
            {"name": b.name.value, "device": b.device, "available": b.available, "reason": b.reason,
             "detail": b.detail, **idle_draw(b), "meter_step_s": b.meter_step_s}
            for b in node.backends
        ],
        "cpu_percent": node.cpu_percent, "owner_cpu_percent": owner_cpu, "farm_cpu_percent": farm_cpu,
        "memory_percent": node.memory_percent,
        "gpu_memory": [{"device": m.device, "used_bytes": m.used_bytes, "total_bytes": m.total_bytes,
                        "percent": 100.0 * m.used_bytes / m.total_bytes if m.total_bytes else None}
                       for m in node.gpu_memory],
        "power_w": power_w, "power_source": combined_source(power_sources),
        "power_estimate": _mixed_estimate(power_sources),
        "power": [{"device": p.device, "watts": p.watts, "source": p.source.value, "scope": p.scope.value,
                   "estimate": is_estimate(p.source.value)} for p in node.power],
        "shards_running": shards_running, "jobs": list(jobs),
        "shards_done": sum(w.shards for w in work), "items_done": items,
        "energy_j": energy_j, "energy_source": combined_source(energy_sources),
        "energy_estimate": _mixed_estimate(energy_sources),
        "marginal_j": marginal_j,
        "models": list(models),
        "last_heartbeat": node.last_heartbeat,
        "hardware": {"cpu_model": node.hardware.cpu_model, "cpu_cores": node.hardware.cpu_cores,
                     "gpus": [g.name for g in node.hardware.gpus], "apple_chip": node.hardware.apple_chip,
                     "os": node.hardware.os, "arch": node.hardware.arch},
    }


def fleet_view(nodes: list[Node], running_jobs: list[Job], work: list[NodeWork], recent_jobs: Iterable[Job] = ()
               ) -> JSON:
    """The overview: every node, the fleet's totals, nodes per backend, and perf/W per model over the recent jobs."""
    running = running_shards_by_node(running_jobs)
    jobs_on = running_jobs_by_node(running_jobs)
    work_of: defaultdict[str, list[NodeWork]] = defaultdict(list)
    for w in work:
        work_of[w.node_id].append(w)
    views = [node_view(n, running[n.id], work_of[n.id], jobs=jobs_on[n.id]) for n in nodes]
    live = [v for v in views if v["state"] in LIVE_STATES]
    by_backend: dict[str, JSON] = {}
    for node in nodes:
        for offer in node.backends:
            if not offer.available:
                continue
            entry = by_backend.setdefault(offer.name.value, {"backend": offer.name.value, "nodes": 0, "ready": 0,
                                                             "devices": 0})
            entry["devices"] += 1
        for name in {o.name.value for o in node.backends if o.available}:
            by_backend[name]["nodes"] += 1
            by_backend[name]["ready"] += int(node.state is NodeState.READY)
    measured = [w for w in work if w.energy_source]
    live_power_sources = [p["source"] for v in live for p in v["power"]]
    energy_sources = [w.energy_source for w in measured]
    return {
        "at": time.time(),
        "nodes": views,
        "backends": sorted(by_backend.values(), key=lambda b: b["backend"]),
        "models": perf_by_model(recent_jobs),
        "totals": {
            "nodes": len(views),
            "by_state": dict(Counter(v["state"] for v in views)),
            "by_activity": dict(Counter(v["activity"] for v in views)),
            "cpu_percent": sum(v["cpu_percent"] for v in live) / len(live) if live else 0.0,
            "owner_cpu_percent": sum(v["owner_cpu_percent"] for v in live) / len(live) if live else 0.0,
            "farm_cpu_percent": sum(v["farm_cpu_percent"] for v in live) / len(live) if live else 0.0,
            "power_w": sum(v["power_w"] for v in live),
            "power_source": combined_source(live_power_sources),
            "power_estimate": _mixed_estimate(live_power_sources),
            "shards_running": sum(running.values()),
            "items_done": sum(w.items for w in work),
            "energy_j": sum(w.energy_j for w in work),
            "energy_source": combined_source(energy_sources),
            "energy_estimate": _mixed_estimate(energy_sources),
            "marginal_j": _marginal(measured),  # no items/J across the fleet: see perf_by_model
        },
    }


# What can set one model's rows apart, in the order a row's label names them (perf_by_model's `setup`).
SETUP_FIELDS = ("backend", "device", "batch_size", "dataset", "weights")
_SETUP_NAMES = {"batch_size": "batch"}


def perf_by_model(jobs: Iterable[Job], node_id: str | None = None) -> list[JSON]:
    """Items per joule per model, backend and device, over the finished shards whose energy was measured (those of
    node `node_id` only, when given). Never one figure across models: an item of one model is not an item of another
    (a digit against a 512-token passage). Rows of one model are told apart by `setup`: what differs between them
    (backend, device, batch size, dataset, weights; else the calibration key: the job's code or environment)."""
    groups: dict[tuple[str, str, str], JSON] = {}
    for job in jobs:
        spec = _spec(job)
        for shard in job.shards:
            if shard.state is not ShardState.SUCCEEDED or not shard.energy_source or shard.energy_j <= 0:
                continue
            if node_id is not None and shard.node_id != node_id:
                continue
            group = groups.setdefault((job.model_key or job.id, shard.backend, shard.device), {
                "model": _model_name(job, spec), "model_key": job.model_key, "backend": shard.backend,
                "device": shard.device, "batch_size": str(spec.get("batch_size", "")),
                "dataset": _text(spec.get("dataset")), "weights": str(spec.get("weights") or ""), "jobs": set(),
                "items": 0, "energy_j": 0.0, "sources": set()})
            group["jobs"].add(job.id)
            group["items"] += shard.items
            group["energy_j"] += shard.energy_j
            group["sources"].add(shard.energy_source)
    rows = []
    for group in groups.values():
        sources = group.pop("sources")
        rows.append({**group, "jobs": len(group["jobs"]), "items_per_j": group["items"] / group["energy_j"],
                     "energy_source": combined_source(sources), "energy_estimate": _mixed_estimate(sources)})
    by_model: defaultdict[str, list[JSON]] = defaultdict(list)
    for row in rows:
        by_model[row["model"]].append(row)
    for same in by_model.values():
        differing = [f for f in SETUP_FIELDS if len({r[f] for r in same}) > 1]
        for row in same:
            named = [f"{_SETUP_NAMES.get(f, f)} {row[f] or '-'}" for f in differing if f != "backend"]
            row["setup"] = " · ".join(named) or (f"calibration key {row['model_key'][:12]}" if len(same) > 1 else "")
    return sorted(rows, key=lambda r: (r["model"], -r["items_per_j"]))


def _spec(job: Job) -> dict[str, Any]:
    """The job's spec as its YAML says (what tells runs of one model apart); {} if it does not parse."""
    try:
        spec = yaml.safe_load(job.spec_yaml)
    except yaml.YAMLError:
        spec = None
    return spec if isinstance(spec, dict) else {}


def _text(value: Any) -> str:
    """A spec field as one short line: a dataset given as a mapping by its location."""
    if isinstance(value, dict):
        return str(value.get("location") or value)
    return "" if value is None else str(value)


def _model_name(job: Job, spec: dict[str, Any]) -> str:
    """What a person calls the job's model: its spec's `model` (kernel-eval jobs have none: the job's name)."""
    model = spec.get("model")
    return str(model) if model else job.name


def log_view(lines: list[JSON]) -> list[JSON]:
    """A job's log lines as the page shows them (the store's rows: id, ts, level, message, shard)."""
    return [{"id": line["id"], "ts": line["ts"], "level": line["level"], "message": line["message"],
             "shard": line["shard"]} for line in lines]


def job_summary(job: Job, now: float | None = None) -> JSON:
    """A row of the jobs list: its state, progress and what it has spent; while it runs, its rate so far (items/s
    since it started) and the time left at that rate (`eta_s`; None until a first item is done)."""
    done = sum(1 for s in job.shards if s.state is ShardState.SUCCEEDED)
    now = time.time() if now is None else now
    rate = eta_s = None
    ran = now - job.started_at - job.metrics.get(PAUSED, 0.0)  # less the time a retried job lay ended
    if job.state is JobState.RUNNING and job.started_at and job.items_done > 0 and ran > 0:
        rate = job.items_done / ran
        eta_s = max(job.items - job.items_done, 0) / rate
    return {
        "rate_items_per_s": rate, "eta_s": eta_s,
        "id": job.id, "name": job.name, "kind": job.kind, "state": job.state.value, "error": job.error,
        "items": job.items, "items_done": job.items_done,
        "progress": job.items_done / job.items if job.items else 0.0,
        "shards": len(job.shards), "shards_done": done,
        "shards_running": sum(1 for s in job.shards if s.state is ShardState.RUNNING),
        "energy_j": job.energy_j, "energy_sources": job.energy_sources,
        "energy_estimate": _mixed_estimate(job.energy_sources), "marginal_j": job.marginal_j,
        "items_per_s": job.metrics.get("items_per_s"), "items_per_j": job.metrics.get("items_per_j"),
        "created_at": job.created_at, "started_at": job.started_at, "finished_at": job.finished_at,
        "finished": job.state.finished,
    }


def job_view(job: Job) -> JSON:
    """The job page: the summary, every shard's placement and figures, and the scheduler's explanation."""
    return {
        **job_summary(job),
        "output": job.output, "metrics": job.metrics, "explanation": job.explanation,
        "cancellable": not job.state.finished,
        "shards_detail": [
            {"index": s.index, "state": s.state.value, "node_id": s.node_id, "node_name": s.node_name,
             "backend": s.backend, "device": s.device, "items": s.items if s.items else s.stop - s.start,
             "seconds": s.seconds, "energy_j": s.energy_j, "energy_source": s.energy_source,
             "energy_scope": s.energy_scope, "energy_estimate": is_estimate(s.energy_source),
             "marginal_j": s.marginal_j,
             "peak_memory_bytes": s.peak_memory_bytes, "attempts": s.attempts, "error": s.error, **_time(s)}
            for s in job.shards
        ],
    }


def _time(shard: Shard) -> JSON:
    """Where the shard's time went on its node (farm.core.phases), as its node reported it; None: not reported."""
    phases = ShardPhases.of(shard.metrics, shard.seconds)
    if phases is None:
        return {"input_wait_s": None, "before_s": None, "before": ""}
    return {"input_wait_s": phases.input_wait, "before_s": phases.before, "before": before_text(phases)}


def _marginal(work: list[NodeWork]) -> float | None:
    """The energy above idle of measured work; None unless all of it has that figure."""
    if not work or any(w.marginal_j is None for w in work):
        return None
    return sum(w.marginal_j or 0.0 for w in work)
