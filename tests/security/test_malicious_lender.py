"""A lender running its own modified agent (tests/security/kit.py) against a real head's control plane: it claims
another node's identity on the work stream and for job code, and sends oversized and malformed messages. Each is
refused in one line with a status that says why (never UNKNOWN), and the honest node keeps what is its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from farm.core.models import JobState
from farm.head.store import Store
from farm.proto import convert
from farm.proto.v1 import agent_pb2
from farm_agent.daemon.client import credentials
from tests.integration.inprocess_head import HW, Head, running_head
from tests.security.kit import Lender


@pytest.fixture()
def head(tmp_path: Path) -> Iterator[Head]:
    with running_head(tmp_path / "state") as running:
        yield running


@pytest.fixture()
def lender(head: Head) -> Lender:
    return Lender(head)


def refused(error: pytest.ExceptionInfo[grpc.RpcError], code: grpc.StatusCode, *words: str) -> None:
    details = error.value.details() or ""
    assert error.value.code() is code, (error.value.code(), details)
    assert "\n" not in details and all(word in details for word in words), details


def test_a_work_stream_claiming_another_node_is_refused_and_takes_nothing_of_it(head: Head, lender: Lender) -> None:
    alice, mallory = lender.join("alice"), lender.join("mallory")
    with pytest.raises(grpc.RpcError) as own_token:  # alice's public id, mallory's certificate and token
        lender.work(mallory, claim=alice.node_id)
    refused(own_token, grpc.StatusCode.UNAUTHENTICATED)
    with pytest.raises(grpc.RpcError) as stolen_token:  # even with alice's token, not alice's certificate
        lender.work(mallory, claim=alice.node_id, token=alice.token)
    refused(stolen_token, grpc.StatusCode.UNAUTHENTICATED, "certificate")
    # Neither hello became alice's link: orders for alice never go to mallory, and alice's stream is not replaced.
    assert alice.node_id not in head.on_loop(lambda: head.dispatcher.links.connected())  # type: ignore[union-attr]
    with pytest.raises(grpc.RpcError) as no_hello:  # a stream that does not start with a hello
        lender.work(mallory, hello=False, reports=[agent_pb2.WorkReport(ack=agent_pb2.WorkAck())])
    refused(no_hello, grpc.StatusCode.UNAUTHENTICATED, "hello")


def test_job_code_goes_only_to_the_node_given_its_shard(head: Head, lender: Lender, tmp_path: Path) -> None:
    alice, mallory = lender.join("alice"), lender.join("mallory")
    code = tmp_path / "code.zip"
    code.write_bytes(b"the job's code")
    store = Store(head.db)
    store.add_job("j-1", "j", "inference", "name: j", str(code), str(tmp_path / "out"), 1, [(0, 1)])
    store.set_job_state("j-1", JobState.RUNNING)
    store.close()
    head.on_loop(lambda: head.dispatcher.job_nodes.add("j-1", alice.node_id))  # type: ignore[union-attr]
    with pytest.raises(grpc.RpcError) as as_herself:
        lender.code(mallory, "j-1")
    refused(as_herself, grpc.StatusCode.UNAUTHENTICATED, "runs no shard")
    with pytest.raises(grpc.RpcError) as as_alice:
        lender.code(mallory, "j-1", claim=alice.node_id, token=alice.token)
    refused(as_alice, grpc.StatusCode.UNAUTHENTICATED, "certificate")
    assert lender.code(alice, "j-1") == b"the job's code"


def test_oversized_messages_are_refused_in_one_line(head: Head, lender: Lender) -> None:
    mallory = lender.join("mallory")
    register = agent_pb2.RegisterRequest(join_token=head.tokens.join, name="big", hardware=convert.hardware_to_pb(HW),
                                         csr_pem=b"x" * (65 * 1024))
    with pytest.raises(grpc.RpcError) as big_register:
        lender.raw("Register", register.SerializeToString(), credentials(head.tokens.join))
    refused(big_register, grpc.StatusCode.INVALID_ARGUMENT, "Register")
    beat = agent_pb2.HeartbeatRequest(node_id=mallory.node_id, node_token=mallory.token, busy="b" * 9000)
    with pytest.raises(grpc.RpcError) as big_beat:
        lender.raw("Heartbeat", beat.SerializeToString(), credentials(mallory.token, mallory.node_id), mallory)
    refused(big_beat, grpc.StatusCode.INVALID_ARGUMENT, "heartbeat")
    with pytest.raises(grpc.RpcError) as huge:  # past any message the head takes: refused from its length
        lender.raw("Register", b"\x0a" + b"\xff" * 5 * 1024 * 1024, credentials(head.tokens.join))
    refused(huge, grpc.StatusCode.RESOURCE_EXHAUSTED)


# Found by this kit: gRPC's own deserializer raised before any Farm code ran, and grpc.aio answered UNKNOWN
# ("Unexpected DecodeError"). The gate's handlers parse without raising and refuse in words (farm.head.gate).
@pytest.mark.parametrize("method", ["Register", "Heartbeat", "Work"])
def test_bytes_that_are_not_the_message_are_refused_not_unknown(head: Head, lender: Lender, method: str) -> None:
    mallory = lender.join("mallory")
    metadata = credentials(head.tokens.join) if method == "Register" else credentials(mallory.token, mallory.node_id)
    with pytest.raises(grpc.RpcError) as malformed:
        lender.raw(method, b"\xff\xff\xff\xff not protobuf", metadata, None if method == "Register" else mallory)
    assert malformed.value.code() is not grpc.StatusCode.UNKNOWN, malformed.value.details()
    assert malformed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
