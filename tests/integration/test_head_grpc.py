"""The head's gRPC control plane on a real server (127.0.0.1, a free port), without Ray: auth, intake, streams."""

from __future__ import annotations

import asyncio
import io
import sqlite3
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from farm.client import Client, HeadInfo
from farm.core.errors import AuthError, ConflictError, UserError
from farm.core.models import BackendName, BackendOffer, Hardware
from farm.head.auth import Tokens
from farm.head.dispatch import Dispatcher
from farm.head.events import JobEvents
from farm.head.server import build_server
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.local import free_port
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc
from farm.tls import new_node_key

SPEC = "name: toy\nmodel: toyjob:doubler\nweights: w.pt\ndataset: toyjob:numbers\nshards: 3\n"
HW = Hardware(hostname="box", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=4, memory_bytes=2**33)


def code_zip(*names: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in names:
            archive.writestr(name, "x")
    return buffer.getvalue()


class Head:
    def __init__(self, settings: HeadSettings, tokens: Tokens) -> None:
        self.settings = settings
        self.tokens = tokens
        self.db = settings.state_dir / "state.db"
        self.ca_pem = (settings.tls_dir / "ca.pem").read_bytes()

    def channel(self, key_pem: bytes | None = None, cert_pem: bytes | None = None, port: int | None = None
                ) -> grpc.Channel:
        """A TLS channel that trusts the head's CA; with a client certificate, to the mutual-TLS port."""
        return grpc.secure_channel(f"127.0.0.1:{port or self.settings.port}",
                                   grpc.ssl_channel_credentials(self.ca_pem, key_pem, cert_pem))


@pytest.fixture()
def head(tmp_path: Path) -> Iterator[Head]:
    settings = HeadSettings(state_dir=tmp_path, host="127.0.0.1", port=free_port())
    tokens = Tokens.load_or_create(tmp_path, settings.ray_token_path)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stopping: asyncio.Event | None = None

    async def serve() -> None:
        nonlocal stopping
        stopping = asyncio.Event()
        store = Store(settings.state_dir / "state.db")
        events = JobEvents()
        server = build_server(settings, tokens, store, Dispatcher(store, settings, events.publish), events)
        await server.start()
        started.set()
        await stopping.wait()
        await server.stop(grace=1)
        store.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    yield Head(settings, tokens)
    loop.call_soon_threadsafe(stopping.set)  # type: ignore[union-attr]
    thread.join(10)


def client(head: Head, token: str | None = None) -> Client:
    return Client(HeadInfo(address=head.settings.address, api_token=token or head.tokens.api, ca_pem=head.ca_pem),
                  timeout=5)


def test_an_accepted_job_is_in_the_store_before_submit_returns(head: Head) -> None:
    with client(head) as c:
        job_id = c.submit(SPEC, code_zip("toyjob.py", "w.pt"), items=10, output="/tmp/out/toy")
    # A separate connection, as a restarted head would open: the job and its shards are committed.
    db = sqlite3.connect(head.db)
    assert db.execute("SELECT name, state, items FROM jobs WHERE id=?", (job_id,)).fetchone() == ("toy", "queued", 10)
    assert db.execute("SELECT COUNT(*) FROM shards WHERE job_id=?", (job_id,)).fetchone() == (3,)
    assert (head.settings.state_dir / "jobs" / job_id / "code.zip").read_bytes() == code_zip("toyjob.py", "w.pt")


@pytest.mark.parametrize(
    ("spec", "names", "items", "output", "message"),
    [
        (SPEC.replace("name: toy", "name: toy\nkind: kernel-eval"), ("toyjob.py", "w.pt"), 10, "/o",
         "kind 'kernel-eval' needs a 'kernel_eval' section"),
        (SPEC.replace("name: toy", "name: toy\nkind: kernel-eval\nkernel_eval: {problems: p, candidates: c}"),
         ("toyjob.py", "w.pt"), 10, "/o", "kernel_eval.problems: no problem files"),
        (SPEC.replace("name: toy", "name: toy\nkind: kernel-eval\nkernel_eval: {problems: p, candidates: c}"),
         ("p/a.py", "c/b/x.py"), 10, "/o", "folder 'b' matches no problem file"),
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
    with client(head) as c, pytest.raises(UserError, match=message):
        c.submit(spec, code_zip(*names), items=items, output=output)
    assert sqlite3.connect(head.db).execute("SELECT COUNT(*) FROM jobs").fetchone() == (0,)


def test_api_calls_need_the_api_token(head: Head) -> None:
    with client(head, token="forged") as c:
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
    with client(head) as c:
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
        agents.Register(request, timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED

    request.join_token = head.tokens.join
    reply = agents.Register(request, timeout=5)
    assert reply.node_id.startswith("n-") and reply.ray_address == head.settings.ray_address
    assert reply.ray_token == head.settings.ray_token_path.read_text()
    assert reply.mtls_port == head.settings.mtls_listen_port
    agents = agent_pb2_grpc.AgentServiceStub(head.channel(key_pem, reply.client_cert_pem, reply.mtls_port))

    beats = agents.Heartbeat(iter([agent_pb2.HeartbeatRequest(
        node_id=reply.node_id, node_token=reply.node_token, cpu_percent=42.0, memory_percent=7.0)]), timeout=5)
    assert [b.state for b in beats] == ["joining"]  # the Ray node has not been seen yet
    with client(head) as c:
        (node,) = c.nodes()
    assert (node.id, node.name, node.cpu_percent, node.backends[0].threads) == (reply.node_id, "box", 42.0, 4)

    with pytest.raises(grpc.RpcError) as forged:
        list(agents.Heartbeat(iter([agent_pb2.HeartbeatRequest(node_id=reply.node_id, node_token="forged")]),
                              timeout=5))
    assert forged.value.code() is grpc.StatusCode.UNAUTHENTICATED

    request.node_id = reply.node_id  # an agent restarted: same node id, new node token
    again = agents.Register(request, timeout=5)
    agents = agent_pb2_grpc.AgentServiceStub(head.channel(key_pem, again.client_cert_pem, again.mtls_port))
    assert again.node_id == reply.node_id and again.node_token != reply.node_token

    agents.Deregister(agent_pb2.DeregisterRequest(node_id=again.node_id, node_token=again.node_token), timeout=5)
    with client(head) as c:
        assert [n.state for n in c.nodes()] == ["offline"]
