"""A lender floods the head with live output (WorkOutput, issue 31's live shard output) through the malicious-lender
kit: for the attempt it was given, for another node's attempt, and for tickets that never existed. The head keeps at
most MAX_TEXT characters of its own attempt's output and nothing of the others'."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.core.models import JobState
from farm.head.joblog import MAX_TEXT
from farm.head.store import Store
from farm.proto.v1 import agent_pb2
from tests.integration.inprocess_head import Head, running_head
from tests.security.kit import Lender

PIECE = 8 * 1024  # the most a worker sends in one piece (capture.LIVE_PIECE); a lender may send more


@pytest.fixture()
def head(tmp_path: Path) -> Iterator[Head]:
    with running_head(tmp_path / "state") as running:
        yield running


def test_a_lender_s_output_flood_is_bounded_and_never_lands_in_another_s_attempt(head: Head, tmp_path: Path) -> None:
    lender = Lender(head)
    alice, mallory = lender.join("alice"), lender.join("mallory")
    store = Store(head.db)
    store.add_job("j-1", "j", "inference", "name: j", str(tmp_path / "code.zip"), str(tmp_path / "out"), 2,
                  [(0, 1), (1, 2)])
    store.set_job_state("j-1", JobState.RUNNING)
    live = head.dispatcher.job_nodes.live  # type: ignore[union-attr]
    head.on_loop(lambda: live.started("t-mallory", "j-1", 0, mallory.node_id))
    head.on_loop(lambda: live.started("t-alice", "j-1", 1, alice.node_id))

    def flood() -> Iterator[agent_pb2.WorkReport]:
        for i in range(400):  # 400 x 64 KiB: 25 MiB, 400 times what the head keeps of an attempt
            yield agent_pb2.WorkReport(output=agent_pb2.WorkOutput(ticket="t-mallory", text=f"{i:05d}" + "m" * 65530))
            yield agent_pb2.WorkReport(output=agent_pb2.WorkOutput(ticket="t-alice", text="forged " * 100))
            yield agent_pb2.WorkReport(output=agent_pb2.WorkOutput(ticket=f"t-none-{i}", text="stray"))

    try:
        lender.work(mallory, reports=flood())
    except Exception:  # noqa: BLE001 - the head may end a flooding stream: what it kept is what is checked
        pass
    logs = store.logs("j-1")
    kept = [row for row in logs if row["level"] == "output"]
    assert kept, "the lender's own attempt's output is kept, up to its bound"
    assert {row["shard"] for row in kept} == {0}  # nothing under alice's shard, nothing from stray tickets
    assert sum(len(row["message"]) for row in kept) <= MAX_TEXT + 200  # the bound, and its one-line marker
    assert "live output stops here" in kept[-1]["message"]
    assert not any("forged" in row["message"] or "stray" in row["message"] for row in logs)
    store.close()
