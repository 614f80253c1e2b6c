"""`/metrics`: the store read at scrape time, in Prometheus' text format. No gauges are kept between scrapes, so a
scrape always says what the store says now: `read` takes the figures, `exposition` renders them.

Labels: `node` is a node's id and `name` its name; `job_id` a job's id (not `job`: Prometheus gives every target
that one). Power and energy carry `source` (counter | vendor-estimate | model-estimate) and `scope` (device | package
| system), so a dashboard can keep estimates apart. farm/dashboard/grafana/farm.json charts these.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from farm.core.models import JobState, Node, NodeState, ShardState, cpu_split
from farm.dashboard.views import running_shards_by_node
from farm.head.store import Job, NodeWork, Store

UNFINISHED = (JobState.QUEUED, JobState.RUNNING)


@dataclass(frozen=True)
class Snapshot:
    """What a scrape reports, read from the store in one go (on the head's event loop, where the store lives)."""

    nodes: list[Node]
    unfinished: list[Job]
    finished: list[Job]  # the latest ones only: each job's series lasts a few scrapes after it ends
    work: list[NodeWork]
    job_counts: dict[str, int]


def read(store: Store, finished_jobs: int = 20) -> Snapshot:
    unfinished = store.jobs(states=UNFINISHED)
    latest = store.jobs(limit=finished_jobs + len(unfinished))
    return Snapshot(store.nodes(), unfinished, [j for j in latest if j.state.finished][:finished_jobs],
                    store.work_by_node(), store.job_counts())


def exposition(snapshot: Snapshot) -> bytes:
    """The text a scrape gets: Farm's figures and the head process's own (CPU, memory, open files). Pure apart from
    reading /proc, so it can run off the event loop: at thousands of nodes it takes a while."""
    registry = CollectorRegistry()
    registry.register(FarmCollector(snapshot))
    ProcessCollector(registry=registry)
    return generate_latest(registry)


class FarmCollector(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        nodes, unfinished, finished = self.snapshot.nodes, self.snapshot.unfinished, self.snapshot.finished
        running = running_shards_by_node(unfinished)
        job_counts = self.snapshot.job_counts

        yield GaugeMetricFamily("farm_up", "1 while the head answers scrapes.", value=1)
        by_state = Counter(n.state.value for n in nodes)
        nodes_gauge = GaugeMetricFamily("farm_nodes", "Nodes in each state.", labels=["state"])
        for state in NodeState:
            nodes_gauge.add_metric([state.value], by_state[state.value])
        yield nodes_gauge
        jobs_gauge = GaugeMetricFamily("farm_jobs", "Jobs in each state.", labels=["state"])
        for job_state in JobState:
            jobs_gauge.add_metric([job_state.value], job_counts.get(job_state.value, 0))
        yield jobs_gauge

        node_labels = ["node", "name"]
        info = GaugeMetricFamily("farm_node_info", "1 per node; its state and backends as labels.",
                                 labels=[*node_labels, "state", "backends"])
        busy = GaugeMetricFamily("farm_node_busy", "1 while the node's owner needs it (no shards go there).",
                                 labels=node_labels)
        cpu = GaugeMetricFamily("farm_node_cpu_utilisation_ratio", "CPU utilisation, 0 to 1.", labels=node_labels)
        farm_cpu = GaugeMetricFamily("farm_node_farm_cpu_utilisation_ratio",
                                     "Of farm_node_cpu_utilisation_ratio, Farm's own processes' share; the rest is the "
                                     "owner's.", labels=node_labels)
        memory = GaugeMetricFamily("farm_node_memory_utilisation_ratio", "Memory in use, 0 to 1.", labels=node_labels)
        gpu_memory = GaugeMetricFamily("farm_node_gpu_memory_used_bytes", "GPU memory in use (NVML), per device.",
                                       labels=[*node_labels, "device"])
        power = GaugeMetricFamily("farm_node_power_watts", "Power per device, from the latest heartbeat.",
                                  labels=[*node_labels, "device", "source", "scope"])
        shards = GaugeMetricFamily("farm_node_shards_running", "Shards running on the node.", labels=node_labels)
        heartbeat = GaugeMetricFamily("farm_node_last_heartbeat_timestamp_seconds", "When the node last beat.",
                                      labels=node_labels)
        for node in nodes:
            labels = [node.id, node.name]
            backends = ",".join(sorted({b.name.value for b in node.backends if b.available}))
            info.add_metric([*labels, node.state.value, backends], 1)
            busy.add_metric(labels, 1 if node.busy else 0)
            cpu.add_metric(labels, node.cpu_percent / 100)
            farm_cpu.add_metric(labels, cpu_split(node)[1] / 100)
            memory.add_metric(labels, node.memory_percent / 100)
            for used in node.gpu_memory:
                gpu_memory.add_metric([*labels, used.device], used.used_bytes)
            for reading in node.power:
                power.add_metric([*labels, reading.device, reading.source.value, reading.scope.value], reading.watts)
            shards.add_metric(labels, running[node.id])
            heartbeat.add_metric(labels, node.last_heartbeat)
        yield from (info, busy, cpu, farm_cpu, memory, gpu_memory, power, shards, heartbeat)

        energy = CounterMetricFamily("farm_node_energy_joules", "Energy of the shards the node finished.",
                                     labels=[*node_labels, "source", "scope"])
        marginal = CounterMetricFamily(
            "farm_node_marginal_energy_joules",
            "Of farm_node_energy_joules, what is above the devices' idle draw read on the same meter.",
            labels=[*node_labels, "source", "scope"])
        items = CounterMetricFamily("farm_node_items", "Items the node's finished shards processed.",
                                    labels=node_labels)
        items_of: Counter[tuple[str, str]] = Counter()
        for work in self.snapshot.work:
            items_of[(work.node_id, work.node_name)] += work.items
            if work.energy_source:  # an unmeasured shard has no energy to count
                energy.add_metric([work.node_id, work.node_name, work.energy_source, work.energy_scope], work.energy_j)
                if work.marginal_j is not None:
                    marginal.add_metric([work.node_id, work.node_name, work.energy_source, work.energy_scope],
                                        work.marginal_j)
        for (node_id, name), count in items_of.items():
            items.add_metric([node_id, name], count)
        yield from (energy, marginal, items)

        job_labels = ["job_id", "name"]
        job_info = GaugeMetricFamily("farm_job_info", "1 per job; its kind and state as labels.",
                                     labels=[*job_labels, "kind", "state"])
        progress = GaugeMetricFamily("farm_job_progress_ratio", "Items done over items, 0 to 1.", labels=job_labels)
        job_items = GaugeMetricFamily("farm_job_items", "Items in the job.", labels=job_labels)
        job_shards = GaugeMetricFamily("farm_job_shards_running", "The job's shards running now.", labels=job_labels)
        job_energy = GaugeMetricFamily("farm_job_energy_joules", "Energy of the job's finished shards.",
                                       labels=[*job_labels, "source"])
        job_marginal = GaugeMetricFamily(
            "farm_job_marginal_energy_joules",
            "Of farm_job_energy_joules, what is above the devices' idle draw (shards with that figure only).",
            labels=[*job_labels, "source"])
        for job in [*unfinished, *finished]:
            labels = [job.id, job.name]
            job_info.add_metric([*labels, job.kind, job.state.value], 1)
            progress.add_metric(labels, job.items_done / job.items if job.items else 0.0)
            job_items.add_metric(labels, job.items)
            job_shards.add_metric(labels, sum(1 for s in job.shards if s.state is ShardState.RUNNING))
            joules: defaultdict[str, float] = defaultdict(float)
            above: defaultdict[str, float] = defaultdict(float)
            for shard in job.shards:
                if shard.state is ShardState.SUCCEEDED and shard.energy_source:
                    joules[shard.energy_source] += shard.energy_j
                    if shard.marginal_j is not None:
                        above[shard.energy_source] += shard.marginal_j
            for source, value in joules.items():
                job_energy.add_metric([*labels, source], value)
            for source, value in above.items():
                job_marginal.add_metric([*labels, source], value)
        yield from (job_info, progress, job_items, job_shards, job_energy, job_marginal)
