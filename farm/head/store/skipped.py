"""A job's rows that do not read: the shard that met them keeps only them, failed, and its other rows become new
shards, in one transaction (farm.scheduler.bad_rows decides the cut)."""

from __future__ import annotations

from farm.core.models import ShardState
from farm.head.store.jobs import JobRecords


class SkippedRecords(JobRecords):
    def shard_skipped(self, job_id: str, index: int, bad: tuple[int, int], rest: list[tuple[int, int]],
                      error: str) -> list[int]:
        """Shard `index` keeps only `bad`, failed with `error`; `rest`, its other rows, become new pending shards
        after the job's last. Their indexes."""
        with self._tx() as db:
            (last,) = db.execute("SELECT MAX(idx) FROM shards WHERE job_id=?", (job_id,)).fetchone()
            db.execute("UPDATE shards SET start=?, stop=?, state=?, error=? WHERE job_id=? AND idx=?",
                       (*bad, ShardState.FAILED.value, error, job_id, index))
            indexes = [last + 1 + i for i in range(len(rest))]
            db.executemany("INSERT INTO shards (job_id, idx, start, stop, state) VALUES (?, ?, ?, ?, ?)",
                           [(job_id, i, a, b, ShardState.PENDING.value) for i, (a, b) in zip(indexes, rest)])
            again = ", ".join(f"[{a}, {b}) is shard {i}" for i, (a, b) in zip(indexes, rest))
            self._log(db, job_id, "error", f"shard {index} failed: {error}; [{bad[0]}, {bad[1]}) skipped"
                                           + (f", its other rows run again: {again}" if again else ""), index)
            return indexes
