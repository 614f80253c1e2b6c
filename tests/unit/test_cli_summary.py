"""What `farm submit --wait` and `farm job ID --wait` print at the end."""

from __future__ import annotations

import pytest

from farm.cli.jobs import show_summary
from farm.proto.v1 import job_pb2


def test_a_failed_jobs_summary_counts_only_the_items_done(capsys: pytest.CaptureFixture[str]) -> None:
    job = job_pb2.Job(id="j-1", name="toy", kind="inference", state="failed", items=32, started_at=1.0,
                      finished_at=3.0, error="shard 1: ValueError: broken", shards=[
                          job_pb2.Shard(index=0, state="succeeded", start=0, stop=16, items=16, node_name="a"),
                          job_pb2.Shard(index=1, state="failed", start=16, stop=32, node_name="b")])
    show_summary(job)
    out = capsys.readouterr().out
    assert "16 of 32 items done" in out and "32 items in" not in out
