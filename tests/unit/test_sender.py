"""A shard's outputs are sent on a thread of their own (farm_agent.work.prefetch.Sender): the model goes on with the
next batch while the last one's are streamed to the head; order kept, errors raised in the model's thread."""

from __future__ import annotations

import threading

import pytest

from farm_agent.work.prefetch import Sender


def test_the_model_goes_on_while_a_batch_is_being_sent_and_order_is_kept() -> None:
    sent: list[int] = []
    first_sending, release = threading.Event(), threading.Event()

    def send(item: int) -> None:
        if item == 0:
            first_sending.set()
            assert release.wait(10)
        sent.append(item)

    sender: Sender[int] = Sender(send, depth=2)
    sender.put(0)
    assert first_sending.wait(10)
    sender.put(1)  # the first batch is still being sent: these return at once (the model's thread goes on)
    sender.put(2)
    assert sent == []
    release.set()
    sender.close()
    assert sent == [0, 1, 2]


def test_a_send_that_fails_fails_the_next_put_or_the_close_and_nothing_after_it_is_sent() -> None:
    sent: list[int] = []

    def send(item: int) -> None:
        if item == 1:
            raise ConnectionError("the head ended the upload")
        sent.append(item)

    sender: Sender[int] = Sender(send, depth=1)
    for item in range(4):
        try:
            sender.put(item)
        except ConnectionError:
            break
    with pytest.raises(ConnectionError, match="ended the upload"):
        sender.close()
    assert sent == [0]


def test_a_stopped_sender_ends_its_thread() -> None:
    sender: Sender[int] = Sender(lambda item: None)
    sender.put(1)
    sender.stop()
    assert not sender._thread.is_alive()
