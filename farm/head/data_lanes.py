"""The head's DataService again on a port of its own (the data port), served by several gRPC servers, each on a
thread and event loop of its own, all listening on that one port (SO_REUSEPORT: the kernel hands each new connection
to one of them). A node opens several connections to it (farm.data.locations.head) and reads a large file's pieces
on them in parallel.

Why: a grpc.aio server does all of a stream's sending (the protobuf, TLS, the socket write) on its event loop's one
thread, however many connections carry the streams: the head's DataService topped out at one core (0.64 GB/s with TLS
on the H200, the loop thread at 100 %), and that loop also carries every heartbeat. Here each lane's loop sends the
streams of its own connections, so several cores send, and the control plane's loop sends none of the bulk bytes
(measured: benchmarks/data_streams.py).

Nothing is looser than on the main port: the same servicer (the read credential checked from metadata at every call,
each file opened once without following links and checked against the plan), the same gate before it (a caller
without a live job's credential is refused before its request is read, counted against it as on the main port), the
same TLS identity. Only the DataService is served here: the main port's servicer (one read pool, each job's plan
loaded once), with a Store of each lane's own (a SQLite connection is one thread's).

Beside them, while there are lanes, the bulk port (farm.head.bulk): ranges of large files over plain TLS, which a node
reads a large file's pieces on, started and stopped with the lanes."""

from __future__ import annotations

import asyncio
import threading

import grpc

from farm.head import datasets
from farm.head.bulk import BulkServer
from farm.head.data_service import DataServicer
from farm.head.gate import AuthGate
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.proto.v1 import data_pb2_grpc
from farm.tls import HeadTLS

OPTIONS = [("grpc.max_send_message_length", 64 * 1024 * 1024), ("grpc.so_reuseport", 1)]


class DataLanes:
    """settings.data_lanes servers on settings.data_listen_port, serving `data` (the main port's DataServicer, its
    tokens' one failure limiter); start() binds them all (or raises), stop() ends them."""

    def __init__(self, settings: HeadSettings, data: DataServicer, tls: HeadTLS | None) -> None:
        self.settings = settings
        self.data = data
        self.tls = tls
        self._lanes: list[tuple[asyncio.AbstractEventLoop, threading.Thread, asyncio.Event]] = []
        self.bulk: BulkServer | None = None

    def start(self) -> None:
        for lane in range(self.settings.data_lanes):
            self._start_one(lane)
        if self.settings.data_lanes:
            try:
                self.bulk = BulkServer(self.settings, self.data, self.tls)
                self.bulk.start()
            except OSError as exc:
                self.stop()
                raise RuntimeError(f"the bulk port {self.settings.bulk_listen_port} does not open: {exc}") from None

    def _start_one(self, lane: int) -> None:
        loop = asyncio.new_event_loop()
        started = threading.Event()
        failed: list[BaseException] = []
        stopping = asyncio.Event()

        async def serve() -> None:
            store = Store(self.settings.state_dir / "state.db")
            try:
                reads_data = datasets.ReadCredentials(self.settings.state_dir, store).admits
                server = grpc.aio.server(options=OPTIONS, interceptors=[AuthGate(self.data.tokens, store,
                                                                                 reads_data=reads_data)])
                data_pb2_grpc.add_DataServiceServicer_to_server(self.data.for_lane(store), server)
                where = f"{self.settings.host}:{self.settings.data_listen_port}"
                if self.tls is None:
                    server.add_insecure_port(where)
                else:
                    server.add_secure_port(where, grpc.ssl_server_credentials(
                        [(self.tls.server_key_pem, self.tls.server_chain_pem)]))
                await server.start()
            except BaseException as exc:
                failed.append(exc)
                store.close()
                started.set()
                return
            started.set()
            try:
                await stopping.wait()
            finally:
                await server.stop(grace=1)
                store.close()

        thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), name=f"farm-data-lane-{lane}",
                                  daemon=True)
        thread.start()
        started.wait(30)
        if failed:
            thread.join(5)
            loop.close()
            self.stop()
            raise RuntimeError(f"the data port {self.settings.data_listen_port} does not open: {failed[0]}")
        self._lanes.append((loop, thread, stopping))

    def stop(self) -> None:
        bulk, self.bulk = self.bulk, None
        if bulk is not None:
            bulk.stop()
        lanes, self._lanes = self._lanes, []
        for loop, _, stopping in lanes:
            loop.call_soon_threadsafe(stopping.set)
        for loop, thread, _ in lanes:
            thread.join(10)
            if not thread.is_alive():
                loop.close()
