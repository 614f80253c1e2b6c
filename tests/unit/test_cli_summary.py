"""What `farm submit --wait` and `farm job ID --wait` print at the end."""

from __future__ import annotations

from collections import Counter

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


def test_a_retried_job_s_summary_gives_its_wall_time_without_the_time_it_lay_ended(
        capsys: pytest.CaptureFixture[str]) -> None:
    job = job_pb2.Job(id="j-1", name="toy", kind="inference", state="succeeded", items=16, started_at=1.0,
                      finished_at=1001.0, metrics={"wall_s": 12.5}, shards=[
                          job_pb2.Shard(index=0, state="succeeded", start=0, stop=16, items=16, node_name="a")])
    show_summary(job)
    assert "16 items in 12.50 s" in capsys.readouterr().out


def test_a_jobs_output_cannot_drive_the_users_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from farm.cli.render import print_log_line

    print_log_line(job_pb2.LogLine(id=1, ts=0.0, level="output", message="ok\x1b]0;pwned\x07\n\tnext", shard=2))
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "[shard 2] ok\ufffd]0;pwned\ufffd" in out
    assert out.splitlines()[1].endswith("\tnext")


def test_farm_nodes_and_top_split_a_nodes_cpu_between_its_owner_and_farm() -> None:
    """A node at 78 % for its owner's own work, 8 % of it Farm's, is not shown as a node busy with Farm's work."""
    from rich.console import Console

    from farm.cli.render import nodes_table
    from farm.cli.top import nodes_table as top_nodes
    from farm.proto.v1 import fleet_pb2

    node = fleet_pb2.Node(id="n-1", name="lender", state="ready", cpu_percent=78.0, farm_cpu_percent=8.0,
                          memory_percent=40.0)
    odd = fleet_pb2.Node(id="n-2", name="odd", state="ready", cpu_percent=10.0, farm_cpu_percent=30.0)
    console = Console(width=200, record=True)
    console.print(nodes_table([node, odd]))
    listed = console.export_text()
    assert "78% (farm 8%)" in listed and "10% (farm 10%)" in listed  # Farm's share never above the machine's
    console = Console(width=200, record=True)
    console.print(top_nodes([node], Counter()))
    header, row = console.export_text().splitlines()[1:3]
    assert header.split()[3:5] == ["CPU", "FARM"] and " 8%" in row
