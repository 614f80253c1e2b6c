"""A job that ended runs again for only what has no result (`farm job ID --retry-missing`): its shards that failed,
were skipped or cancelled go back to the queue as they were (their indexes and row ranges), those that succeeded
stay, and the job runs again as its next run, in one transaction."""

from __future__ import annotations

import json
import time

from farm.core.errors import ConflictError, NotFoundError
from farm.core.models import JobState, ShardState
from farm.head.store.jobs import JobRecords


PAUSED = "paused_s"  # a job's metric: seconds it lay ended between its runs (farm.head.outcomes.job_metrics)


class RetryRecords(JobRecords):
    def retry_missing(self, job_id: str) -> list[int]:
        """The ended job's shards without a result pending again (their tries counted afresh), and the job running
        as its next run, its error cleared; the indexes of those shards. A job cut as it runs (`shards: auto`) that
        ended before its last cut has its uncut rows missing too: the dispatcher cuts them as it would have.
        ConflictError: the job has not ended, or misses nothing."""
        with self._tx() as db:
            row = db.execute("SELECT state, items, run, started_at, finished_at, metrics FROM jobs WHERE id=?",
                             (job_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no job {job_id!r}")
            state = JobState(row["state"])
            if not state.finished:
                raise ConflictError(f"job {job_id} is {state.value}: only a job that has ended can run its missing "
                                    "rows again")
            shards = db.execute("SELECT idx, start, stop, state FROM shards WHERE job_id=? ORDER BY idx",
                                (job_id,)).fetchall()
            missing = [r for r in shards if r["state"] != ShardState.SUCCEEDED.value]
            frontier = max((r["stop"] for r in shards), default=0)
            if not missing and frontier >= row["items"]:
                raise ConflictError(f"job {job_id} has nothing missing: every shard has its result")
            db.execute("UPDATE shards SET state=?, error='', attempts=0 WHERE job_id=? AND state!=?",
                       (ShardState.PENDING.value, job_id, ShardState.SUCCEEDED.value))
            run = row["run"] + 1
            metrics = json.loads(row["metrics"])
            if row["started_at"] and row["finished_at"]:  # the time it lay ended is no part of its wall time
                metrics[PAUSED] = metrics.get(PAUSED, 0.0) + max(time.time() - row["finished_at"], 0.0)
            db.execute("UPDATE jobs SET state=?, error='', finished_at=0, run=?, metrics=? WHERE id=?",
                       (JobState.RUNNING.value, run, json.dumps(metrics), job_id))
            rows = sum(r["stop"] - r["start"] for r in missing)
            what = [f"shards {', '.join(str(r['idx']) for r in missing)} ({rows} rows) run again"] if missing else []
            if frontier < row["items"]:
                what.append(f"rows [{frontier}, {row['items']}) not cut yet are cut as it runs")
            self._log(db, job_id, "info", f"retry of the rows without results began (run {run}, the job was "
                                          f"{state.value}): {'; '.join(what)}")
            return [r["idx"] for r in missing]
