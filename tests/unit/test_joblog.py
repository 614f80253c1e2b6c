"""The head's job log: a shard's output and traceback from its node, a head restart, following the log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from farm.core.models import BackendName, BackendOffer, Hardware, JobState, Node
from farm.core.tasks import SHARD_LOG_ATTR, SHARD_TRACEBACK_ATTR
from farm.head import joblog
from farm.head.events import JobEvents
from farm.head.store import Store

HW = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=2, memory_bytes=2**30)


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "state.db")
    store.add_job("j-1", "toy", "inference", "name: toy\n", "/code.zip", "/out", 10, [(0, 5), (5, 10)])
    store.upsert_node("n-1", "a", HW, [BackendOffer(name=BackendName.CPU, device="cpu")], "127.0.0.1", "hash")
    return store


def node(store: Store) -> Node:
    return store.nodes()[0]


def test_a_shards_output_and_traceback_are_logged_under_its_index(store: Store) -> None:
    store.shard_started("j-1", 0, node(store), "cpu", "cpu")
    joblog.record_output(store, "j-1", 0, type("R", (), {"log": "hello\nworld\n"})())
    error = RuntimeError("boom")
    setattr(error, SHARD_LOG_ATTR, "before the boom\n")
    setattr(error, SHARD_TRACEBACK_ATTR, "Traceback (most recent call last):\n  ...\nRuntimeError: boom\n")
    joblog.record_error(store, "j-1", 1, error)
    joblog.record_output(store, "j-1", 1, type("R", (), {"log": ["not", "text"]})())  # a node's junk: dropped
    by_shard = {(line["shard"], line["level"], line["message"])
                for line in store.logs("j-1") if line["shard"] is not None}
    assert (0, "output", "hello\nworld") in by_shard
    assert (1, "output", "before the boom") in by_shard
    assert (1, "error", "Traceback (most recent call last):\n  ...\nRuntimeError: boom") in by_shard
    assert [line["message"] for line in store.logs("j-1", shard=1)] == [
        "before the boom", "Traceback (most recent call last):\n  ...\nRuntimeError: boom"]
    assert all(line["shard"] == 0 for line in store.logs("j-1", shard=0))
    ids = [line["id"] for line in store.logs("j-1")]
    assert ids == sorted(ids) and store.logs("j-1", after=ids[-2]) == store.logs("j-1")[-1:]


def test_what_a_node_sends_is_bounded_again_on_the_head(store: Store) -> None:
    joblog.record_output(store, "j-1", 0, type("R", (), {"log": "y" * (10 * joblog.MAX_TEXT)})())
    kept = store.logs("j-1", shard=0)[-1]["message"]
    assert len(kept) < joblog.MAX_TEXT + 100 and "characters dropped by the head" in kept


def test_a_head_restart_is_written_to_each_unfinished_jobs_log(store: Store) -> None:
    store.shard_started("j-1", 1, node(store), "cpu", "cpu")
    joblog.record_restart(store)
    assert store.logs("j-1")[-1]["message"] == "the head restarted: shards 1 were running and go back to the queue"


def test_following_yields_new_lines_until_the_job_ends(store: Store) -> None:
    events = JobEvents()

    async def scenario() -> list[str]:
        seen: list[str] = []

        async def follow() -> None:
            async for line in joblog.follow(store, events, "j-1"):
                seen.append(line["message"])

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.05)
        store.log("j-1", "info", "a line written while following")
        events.publish("j-1")
        await asyncio.sleep(0.05)
        store.set_job_state("j-1", JobState.CANCELLED)
        events.publish("j-1")
        await asyncio.wait_for(task, 5)
        return seen

    seen = asyncio.run(scenario())
    assert seen[0].startswith("accepted:") and seen[-2:] == ["a line written while following", "job cancelled"]
