"""What finished shards measured, read back for calibration (speed, energy, memory) and the dashboard's counters."""

from __future__ import annotations

from dataclasses import dataclass

from farm.core.models import ShardState
from farm.head.store.db import Database
from farm.scheduler.calibration import RECENT, Sample


@dataclass(frozen=True)
class NodeWork:
    """What a node's finished shards add up to, per energy source and scope (all time)."""

    node_id: str
    node_name: str
    energy_source: str
    energy_scope: str
    shards: int
    items: int
    seconds: float
    energy_j: float
    marginal_j: float | None  # None unless every one of these shards has a marginal figure


class CalibrationRecords(Database):
    """Reads over the jobs' shards (farm.head.store.jobs keeps them)."""

    def samples(self, model_key: str, per_device: int = RECENT, job_id: str = "") -> list[Sample]:
        """The latest finished shards of a model, per (node, device): what calibration learns from. With `job_id`,
        the latest of that job's own and the latest of the other jobs', apart: a busy model's other jobs do not push
        a job's own measurements out of the window that overrules a prior (farm.scheduler.calibration)."""
        rows = self._db.execute(
            """SELECT job_id, node_id, device, items, seconds, energy_j, energy_source, marginal_j, finished_at FROM (
                 SELECT s.*, ROW_NUMBER() OVER (PARTITION BY s.node_id, s.device, s.job_id = ?
                                                ORDER BY s.finished_at DESC) AS n
                 FROM shards s JOIN jobs j ON j.id = s.job_id
                 WHERE j.model_key = ? AND s.state = ? AND s.seconds > 0)
               WHERE n <= ?""",
            (job_id, model_key, ShardState.SUCCEEDED.value, per_device),
        ).fetchall()
        return [
            Sample(node_id=r["node_id"], device=r["device"], items=r["items"], seconds=r["seconds"],
                   energy_j=r["energy_j"], energy_source=r["energy_source"], marginal_j=r["marginal_j"],
                   finished_at=r["finished_at"], job_id=r["job_id"])
            for r in rows
        ]

    def peak_memory(self, model_key: str) -> dict[str, int]:
        """Per backend, the most memory a finished shard of this model has taken."""
        rows = self._db.execute(
            """SELECT s.backend, MAX(s.peak_memory_bytes) AS peak FROM shards s JOIN jobs j ON j.id = s.job_id
               WHERE j.model_key = ? AND s.state = ? AND s.peak_memory_bytes > 0 GROUP BY s.backend""",
            (model_key, ShardState.SUCCEEDED.value),
        ).fetchall()
        return {r["backend"]: r["peak"] for r in rows}

    def work_by_node(self) -> list[NodeWork]:
        """Per node and energy source, the finished shards' items, seconds and joules: the dashboard's perf/W and
        energy counters (read-only)."""
        rows = self._db.execute(
            """SELECT node_id, MAX(node_name) AS node_name, energy_source, energy_scope, COUNT(*) AS shards,
                      SUM(items) AS items, SUM(seconds) AS seconds, SUM(energy_j) AS energy_j,
                      CASE WHEN COUNT(marginal_j) = COUNT(*) THEN SUM(marginal_j) END AS marginal_j
               FROM shards WHERE state = ? GROUP BY node_id, energy_source, energy_scope""",
            (ShardState.SUCCEEDED.value,),
        ).fetchall()
        return [NodeWork(**dict(r)) for r in rows]
