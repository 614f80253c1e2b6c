"""A running shard's output goes to the head while it runs (issue 31, item 5): the worker's side (what goes live and
what waits for the end, never twice) and the head's (who may send it, how much it keeps)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from farm.head.joblog import MAX_TEXT, LiveOutput
from farm.head.store import Store
from farm.proto.v1 import agent_pb2
from farm_agent.work.capture import KEEP_BYTES, LIVE, LIVE_PIECE, BoundedText, captured, live


def test_whole_lines_go_live_and_the_end_brings_only_the_rest() -> None:
    stream = BoundedText()
    stream.write("model built\nstarting batch")
    assert stream.take_live() == "model built\n"  # the unfinished line waits for its newline
    assert stream.take_live() == ""
    stream.write(" 0\n")
    assert stream.take_live() == "starting batch 0\n"
    stream.write("done")
    assert stream.unsent() == "done"  # what the result carries: nothing sent live goes again
    stream.write("\nlate\n")
    assert stream.take_live() == ""  # once the rest is taken, nothing more goes live


def test_only_the_first_kept_characters_stream_and_the_tail_comes_at_the_end_with_the_count() -> None:
    stream = BoundedText()
    lines = [f"line {i:06d}\n" for i in range(20_000)]  # 240,000 characters: far past what the head keeps
    for line in lines:
        stream.write(line)
    sent = []
    while piece := stream.take_live():
        assert len(piece) <= LIVE_PIECE
        sent.append(piece)
    live_text, rest = "".join(sent), stream.unsent()
    assert len(live_text) <= KEEP_BYTES and "".join(lines).startswith(live_text)
    assert "characters dropped" in rest and rest.endswith(lines[-1])
    assert live_text + rest == BoundedText.getvalue(_filled(lines))  # together: exactly what was kept before


def _filled(lines: list[str]) -> BoundedText:
    stream = BoundedText()
    for line in lines:
        stream.write(line)
    return stream


def test_a_long_line_without_a_newline_goes_live_as_it_is() -> None:
    stream = BoundedText()
    stream.write("x" * 5000)
    assert len(stream.take_live()) == 5000


def test_the_running_shard_s_prints_reach_the_sender_and_a_failure_carries_only_the_rest() -> None:
    stream = BoundedText()
    pieces: list[str] = []
    with pytest.raises(ValueError) as raised, live(stream), captured(stream):
        print("loading the model")
        LIVE.send(pieces.append)  # what the worker's sender thread does every half second
        print("about to fail")
        raise ValueError("broken")
    assert pieces == ["loading the model\n"]
    assert raised.value.farm_log == "about to fail\n"  # type: ignore[attr-defined]
    LIVE.send(pieces.append)  # the shard ended: the sender finds nothing
    assert pieces == ["loading the model\n"]


def test_a_sender_and_the_shard_s_end_racing_lose_and_double_nothing() -> None:
    for _ in range(50):
        stream, pieces = BoundedText(), []
        with live(stream):
            for i in range(200):
                stream.write(f"{i}\n")
            sender = threading.Thread(target=LIVE.send, args=(pieces.append,))
            sender.start()
        rest = stream.unsent()
        sender.join()
        assert "".join(pieces) + rest == "".join(f"{i}\n" for i in range(200))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "state.db")
    store.add_job("j-1", "toy", "inference", "name: toy\n", "/code.zip", "/out", 10, [(0, 10)])
    return store


def _output(store: Store) -> list[str]:
    return [line["message"] for line in store.logs("j-1") if line["level"] == "output"]


def test_the_head_records_live_output_from_the_attempt_s_node_only_and_bounded(store: Store) -> None:
    woken: list[str] = []
    live_output = LiveOutput(store, woken.append)
    live_output.started("t-1", "j-1", 0, "n-1")
    live_output.record("n-2", agent_pb2.WorkOutput(ticket="t-1", text="forged by another node\n"))
    live_output.record("n-1", agent_pb2.WorkOutput(ticket="t-9", text="an unknown ticket\n"))
    assert _output(store) == [] and woken == []
    live_output.record("n-1", agent_pb2.WorkOutput(ticket="t-1", text="model built\n"))
    assert _output(store) == ["model built"] and woken == ["j-1"]
    assert store.logs("j-1", shard=0)[-1]["message"] == "model built"
    for _ in range(20):  # a node sending far more than a shard's output may hold
        live_output.record("n-1", agent_pb2.WorkOutput(ticket="t-1", text="y" * 8192))
    kept = _output(store)
    assert sum(map(len, kept)) <= MAX_TEXT + 200 and "live output stops here" in kept[-1]
