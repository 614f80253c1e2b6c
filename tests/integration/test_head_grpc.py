"""The head's gRPC control plane on a real server (127.0.0.1, a free port), without Ray: auth, intake, streams."""

from __future__ import annotations

import io
import sqlite3
import zipfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from farm.core.errors import AuthError, ConflictError, UserError
from farm.core.models import BackendName, BackendOffer
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc
from farm.tls import new_node_key
from farm_agent.daemon.client import credentials
from tests.integration.inprocess_head import HW, Head, running_head

SPEC = "name: toy\nmodel: toyjob:doubler\nweights: w.pt\ndataset: toyjob:numbers\nshards: 3\n"
KERNELS = "name: toy\nkind: kernel-eval\n"  # a kernel-eval spec names no model nor dataset (its kind has none)


def code_zip(*names: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in names:  # a fixed date: two archives built across a 2-second tick would differ
            archive.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), "x")
    return buffer.getvalue()


@pytest.fixture()
def head(tmp_path: Path) -> Iterator[Head]:
    with running_head(tmp_path) as running:
        yield running


def test_an_accepted_job_is_in_the_store_before_submit_returns(head: Head) -> None:
    with head.client() as c:
        job_id = c.submit(SPEC, code_zip("toyjob.py", "w.pt"), items=10, output="/tmp/out/toy")
    # A separate connection, as a restarted head would open: the job and its shards are committed.
    db = sqlite3.connect(head.db)
    assert db.execute("SELECT name, state, items FROM jobs WHERE id=?", (job_id,)).fetchone() == ("toy", "queued", 10)
    assert db.execute("SELECT COUNT(*) FROM shards WHERE job_id=?", (job_id,)).fetchone() == (3,)
    assert (head.settings.state_dir / "jobs" / job_id / "code.zip").read_bytes() == code_zip("toyjob.py", "w.pt")


@pytest.mark.parametrize(
    ("spec", "names", "items", "output", "message"),
    [
        (KERNELS, ("toyjob.py", "w.pt"), 10, "/o", "kind 'kernel-eval' needs a 'kernel_eval' section"),
        (KERNELS + "kernel_eval: {problems: p, candidates: c}", ("toyjob.py", "w.pt"), 10, "/o",
         "kernel_eval.problems: no problem files"),
        (KERNELS + "kernel_eval: {problems: p, candidates: c}", ("p/a.py", "c/b/x.py"), 10, "/o",
         "folder 'b' matches no problem file"),
        (SPEC.replace("name: toy", "name: toy\nkind: training\ntraining: {steps: 5}"), ("toyjob.py", "w.pt"), 10,
         "/o", "batch_size 64 is larger than the dataset"),
        (SPEC, ("toyjob.py",), 10, "/o", "weights 'w.pt' is not in the job's code"),
        (SPEC, ("toyjob.py", "w.pt"), 0, "/o", "the dataset is empty"),
        (SPEC, ("toyjob.py", "w.pt"), 10, "relative/out", "output must be an absolute path"),
        ("name: [", ("toyjob.py",), 10, "/o", "not valid YAML"),
    ],
)
def test_the_head_validates_what_clients_send(head: Head, spec: str, names: tuple[str, ...], items: int,
                                              output: str, message: str) -> None:
    with head.client() as c, pytest.raises(UserError, match=message):
        c.submit(spec, code_zip(*names), items=items, output=output)
    assert sqlite3.connect(head.db).execute("SELECT COUNT(*) FROM jobs").fetchone() == (0,)


def test_api_calls_need_the_api_token(head: Head) -> None:
    with head.client(token="forged") as c:
        with pytest.raises(AuthError, match="invalid or missing API token"):
            c.nodes()
        with pytest.raises(AuthError):
            c.submit(SPEC, code_zip("toyjob.py", "w.pt"), 10, "/o")
    with pytest.raises(grpc.RpcError) as caught:  # the join token is not an API token
        head.channel().unary_unary(
            "/farm.v1.FleetService/ListNodes", request_serializer=lambda m: b"", response_deserializer=bytes
        )(b"", metadata=(("authorization", f"Bearer {head.tokens.join}"),), timeout=5)
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_watch_streams_until_the_job_ends_and_cancel_ends_it(head: Head) -> None:
    with head.client() as c:
        job_id = c.submit(SPEC, code_zip("toyjob.py", "w.pt"), items=10, output="/tmp/out/toy")
        stream = c.watch(job_id)
        assert next(stream).state == "queued"
        assert c.cancel(job_id).state == "cancelled"
        assert [j.state for j in stream] == ["cancelled"]
        with pytest.raises(ConflictError, match="already cancelled"):
            c.cancel(job_id)
        assert [line.message for line in c.logs(job_id)][-1] == "job cancelled"


def test_agents_register_heartbeat_and_leave(head: Head) -> None:
    agents = agent_pb2_grpc.AgentServiceStub(head.channel())
    offer = BackendOffer(name=BackendName.CPU, device="cpu", threads=4)
    key_pem, csr_pem = new_node_key()
    request = agent_pb2.RegisterRequest(
        join_token="forged", name="box", hardware=convert.hardware_to_pb(HW), backends=[convert.offer_to_pb(offer)],
        csr_pem=csr_pem,
    )
    with pytest.raises(grpc.RpcError) as refused:
        agents.Register(request, metadata=credentials("forged"), timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED

    request.join_token = head.tokens.join
    reply = agents.Register(request, metadata=credentials(head.tokens.join), timeout=5)
    # A lent node (a join token alone): no Ray address or token of the head's; its shards come over its work stream
    assert reply.node_id.startswith("n-") and (reply.ray_address, reply.ray_token) == ("", "")
    assert reply.mtls_port == head.settings.mtls_listen_port
    agents = agent_pb2_grpc.AgentServiceStub(head.channel(key_pem, reply.client_cert_pem, reply.mtls_port))

    beats = agents.Heartbeat(iter([agent_pb2.HeartbeatRequest(
        node_id=reply.node_id, node_token=reply.node_token, cpu_percent=42.0, memory_percent=7.0)]),
        metadata=credentials(reply.node_token, reply.node_id), timeout=5)
    assert [b.state for b in beats] == ["joining"]  # the Ray node has not been seen yet
    with head.client() as c:
        (node,) = c.nodes()
    assert (node.id, node.name, node.cpu_percent, node.backends[0].threads) == (reply.node_id, "box", 42.0, 4)

    with pytest.raises(grpc.RpcError) as forged:
        list(agents.Heartbeat(iter([agent_pb2.HeartbeatRequest(node_id=reply.node_id, node_token="forged")]),
                              metadata=credentials("forged", reply.node_id), timeout=5))
    assert forged.value.code() is grpc.StatusCode.UNAUTHENTICATED

    request.node_id = reply.node_id  # an agent restarted: same node id (its certificate proves it), new node token
    again = agents.Register(request, metadata=credentials(head.tokens.join), timeout=5)
    agents = agent_pb2_grpc.AgentServiceStub(head.channel(key_pem, again.client_cert_pem, again.mtls_port))
    assert again.node_id == reply.node_id and again.node_token != reply.node_token

    agents.Deregister(agent_pb2.DeregisterRequest(node_id=again.node_id, node_token=again.node_token),
                      metadata=credentials(again.node_token, again.node_id), timeout=5)
    with head.client() as c:
        assert [n.state for n in c.nodes()] == ["offline"]
