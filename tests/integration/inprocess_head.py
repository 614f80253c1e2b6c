"""A head's gRPC control plane in a thread of the test process (127.0.0.1, free ports, its own CA, no Ray), and a
handle on it for the tests that call it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc

from farm.client import Client, HeadInfo
from farm.core.models import Hardware
from farm.head.auth import Tokens
from farm.head.dispatch import Dispatcher
from farm.head.events import JobEvents
from farm.head.server import build_server
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.local import free_ports
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc
from farm.tls import new_node_key
from farm_agent.daemon.client import credentials

T = TypeVar("T")
HW = Hardware(hostname="box", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=4, memory_bytes=2**33)


class Head:
    def __init__(self, settings: HeadSettings, tokens: Tokens, dispatcher: Dispatcher | None = None,
                 loop: asyncio.AbstractEventLoop | None = None, events: JobEvents | None = None) -> None:
        self.settings = settings
        self.events = events
        self.tokens = tokens
        self.dispatcher = dispatcher  # the head's, never started (no Ray): tests plant its state through on_loop
        self.loop = loop
        self.db = settings.state_dir / "state.db"
        self.ca_pem = b"" if settings.insecure else (settings.tls_dir / "ca.pem").read_bytes()

    def on_loop(self, call: Callable[[], T]) -> T:
        """`call` run on the head's event loop (where its dispatcher's state lives), its result here."""
        assert self.loop is not None

        async def run() -> T:
            return call()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def channel(self, key_pem: bytes | None = None, cert_pem: bytes | None = None, port: int | None = None,
                ca_pem: bytes | None = None) -> grpc.Channel:
        return grpc.secure_channel(f"127.0.0.1:{port or self.settings.port}",
                                   grpc.ssl_channel_credentials(ca_pem or self.ca_pem, key_pem, cert_pem))

    def client(self, token: str | None = None, ca_pem: bytes | None = None) -> Client:
        info = HeadInfo(address=self.settings.address, api_token=token or self.tokens.api,
                        ca_pem=ca_pem or self.ca_pem)
        return Client(info, timeout=5)

    def register(self, join_token: str, name: str = "box", node_id: str = "", node_token: str = "",
                 identity: tuple[bytes, bytes] | None = None, admin_token: str = ""
                 ) -> tuple[agent_pb2.RegisterReply, bytes]:
        """Register (as `node_id`, if given); with `identity` (key, certificate) over mutual TLS. Without a join
        token, on the node's own token and id (a node joining again). `admin_token`: a trusted node's (the API
        token)."""
        key_pem, csr_pem = new_node_key()
        request = agent_pb2.RegisterRequest(join_token=join_token, name=name, hardware=convert.hardware_to_pb(HW),
                                            csr_pem=csr_pem, node_id=node_id, node_token=node_token,
                                            admin_token=admin_token)
        port = self.settings.mtls_listen_port if identity else None
        with self.channel(*(identity or (None, None)), port=port) as channel:
            metadata = credentials(join_token) if join_token else credentials(node_token, node_id)
            reply = agent_pb2_grpc.AgentServiceStub(channel).Register(request, metadata=metadata, timeout=5)
            return reply, key_pem


@contextmanager
def running_head(state: Path, **options: Any) -> Iterator[Head]:
    """A head's control plane in a thread of this process, with its own CA in `state`."""
    options = {**dict(zip(("port", "mtls_port", "data_port", "bulk_port"), free_ports(4), strict=True)),
               "data_lanes": 2, **options}  # a given port: a head started again
    settings = HeadSettings(state_dir=state, host="127.0.0.1", **options)
    tokens = Tokens.load_or_create(state, settings.ray_token_path)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stopping: asyncio.Event | None = None
    dispatcher: Dispatcher | None = None
    events = JobEvents()

    async def serve() -> None:
        nonlocal stopping, dispatcher
        stopping = asyncio.Event()
        store = Store(state / "state.db")
        dispatcher = Dispatcher(store, settings, events.publish)
        served = tokens.for_server(settings)  # one limiter for the control plane and the data lanes, as a head's
        server, lanes = build_server(settings, served, store, dispatcher, events)
        await server.start()
        await asyncio.to_thread(lanes.start)
        started.set()
        await stopping.wait()
        await asyncio.to_thread(lanes.stop)
        await server.stop(grace=1)
        store.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield Head(settings, tokens, dispatcher, loop, events)
    finally:
        loop.call_soon_threadsafe(stopping.set)  # type: ignore[union-attr]
        thread.join(10)


if __name__ == "__main__":  # `python -m tests.integration.inprocess_head STATE`: a head in a process of its own
    import sys

    with running_head(Path(sys.argv[1])) as served:
        print(served.settings.port, flush=True)
        sys.stdin.read()  # until the test closes our stdin
