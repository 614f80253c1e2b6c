"""The head process: a Ray head, the Ray driver, the SQLite store and the gRPC control plane, composed."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Protocol

import grpc
import ray

from farm import __version__, ray_user
from farm.core.errors import UserError
from farm.head import datasets, uploads
from farm.head.auth import DEFAULT_JOIN_TOKEN_ID, Tokens, hash_token
from farm.head.data_lanes import DataLanes
from farm.head.data_service import DataServicer
from farm.head.result_service import ResultServicer
from farm.head.dispatch import Dispatcher
from farm.head.events import JobEvents
from farm.head.gate import AuthGate
from farm.head.jobs import Jobs
from farm.head.ray_compat import keep_loopback, use_ray_token
from farm.head.servicers import AgentServicer, FleetServicer, JobServicer
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.local import (
    RayProcess, clear_left_behind, free_port, keep_private, read_json, recorded_alive, this_process, write_json,
)
from farm.proto.v1 import agent_pb2_grpc, data_pb2_grpc, fleet_pb2_grpc, job_pb2_grpc, result_pb2_grpc
from farm.tls import HeadTLS, join_command

log = logging.getLogger("farm.head")

# Received: small messages only, whoever sends them (a job's code comes in chunks: farm.head.uploads). Sent: a
# listing of many jobs may be large.
GRPC_OPTIONS = [("grpc.max_receive_message_length", uploads.MAX_MESSAGE),
                ("grpc.max_send_message_length", 256 * 1024 * 1024),
                ("grpc.so_reuseport", 0)]  # its ports are its own: only the data lanes share theirs (data_lanes)


class HeadService(Protocol):
    """Something the entry point serves alongside the control plane, on the head's event loop (the dashboard): the
    head knows it only by this shape, so it never imports what composes it."""

    async def start(self, store: Store, jobs: Jobs, tokens: Tokens, tls: HeadTLS | None) -> dict[str, str]:
        """Start serving (`tokens` under the head's policy, the one failure limiter; `tls` None: the head runs
        --insecure); return what head.json should say of it (its address)."""

    async def stop(self) -> None: ...


def head_tls(settings: HeadSettings) -> HeadTLS:
    """The head's CA (made at first start) and a server certificate naming every address clients may use."""
    names = [settings.advertise, settings.host, "127.0.0.1", "localhost", socket.gethostname(), *settings.tls_names]
    return HeadTLS.load_or_create(settings.tls_dir, names)


def check_can_start(settings: HeadSettings) -> None:
    info = read_json(settings.info_path)
    if recorded_alive(info):
        raise UserError(f"a head is already running from {settings.state_dir} (pid {info['pid']})")
    ended = clear_left_behind(settings.ray_record_path)  # the Ray head of a head killed outright holds its ports
    if ended:
        log.warning("ended %d Ray processes left running by a head that was killed (pids %s)", len(ended),
                    " ".join(map(str, ended)))
    ports = [(settings.port, "--port"), (settings.ray_port, "--ray-port")]
    if not settings.insecure:
        ports.append((settings.mtls_listen_port, "--mtls-port"))
    if settings.data_lanes:
        ports += [(settings.data_listen_port, "--data-port"), (settings.bulk_listen_port, "--bulk-port")]
    for port, what in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((settings.advertise if what == "--ray-port" else settings.host, port))
            except OSError as exc:
                raise UserError(f"cannot listen on port {port} ({what}): {exc.strerror}") from None


def serve(settings: HeadSettings, on_ready: Callable[[str], None] = lambda join: None,
          services: Sequence[HeadService] = ()) -> None:
    """Run the head in the foreground until SIGTERM or SIGINT; leaves no Ray process behind."""
    check_can_start(settings)
    keep_private(settings.state_dir)  # its tokens and keys, its store and logs: this user's alone
    check_store(settings.state_dir / "state.db")
    tokens = Tokens.load_or_create(settings.state_dir, settings.ray_token_path)
    use_ray_token(settings.ray_token_path)
    # The Ray node never as root (farm.ray_user): a task pinned to it needs no resources, and must not be able to
    # read this state folder. Its folder is its own and fresh: Ray refuses `--head` at an address its folder names
    # as the current cluster while a raylet on this host (an agent's, of a head killed outright) still names it.
    user = ray_user.ensure(settings.ray_user) if settings.ray_user else None
    if user is not None:
        ray_user.check_reachable(user)
    ray_head = RayProcess(
        [
            "--head", "--port", str(settings.ray_port), "--node-ip-address", settings.advertise, "--num-cpus", "0",
            "--num-gpus", "0", "--include-dashboard=false", "--ray-client-server-port", str(ray_client_port(settings)),
            "--object-store-memory", str(settings.object_store_mb * 1024 * 1024), *ray_port_args(settings),
        ],
        settings.ray_token_path, settings.state_dir / "ray-head.log", record=settings.ray_record_path, user=user,
        folder=settings.ray_temp_dir,
    )
    ray_head.start()
    try:
        if not ray_head.running:
            raise ray_head.failure()
        if ray_head.loopback:
            keep_loopback()
        # The driver (this process) logs to its stderr, the head's own log, not to a file of the session's logs
        # folder: that folder is the Ray user's, and Ray's rotation opens a log again by name, so a link swapped in
        # there would have the head (root) truncate any file (issue 30, finding 14); its warnings only, as the head's
        # own. Set after the Ray node started, whose own logs stay in its folder.
        os.environ.update(RAY_LOG_TO_STDERR="1", RAY_BACKEND_LOG_LEVEL="warning")
        ray.init(address=settings.ray_address, namespace="farm", log_to_driver=False, logging_level=logging.WARNING)
        run_loop(_serve(settings, tokens, on_ready, services))
    finally:
        if ray.is_initialized():
            ray.shutdown()
        ray_head.stop()
        settings.info_path.unlink(missing_ok=True)


def ray_client_port(settings: HeadSettings) -> int:
    """A free port for Ray's client server, never one of the head's own: those it binds after Ray starts, and a pick
    of one of them would fail the head's start ("Failed to bind to address")."""
    return free_port(avoid=settings.own_ports)


def check_store(path: Path) -> None:
    """Open the store once before anything starts: a damaged one is one line, not a traceback from the event loop."""
    try:
        Store(path).close()
    except sqlite3.DatabaseError as exc:
        raise UserError(f"{path} cannot be read as Farm's store ({exc}): restore it from a backup, or move it away "
                        "to start with an empty one") from None


def run_loop(main: Coroutine[object, object, None]) -> None:
    """Run the head's event loop: uvloop's where it installs (not on Windows). The loop carries every heartbeat, and
    uvloop's costs less per beat than asyncio's own (grpc.aio runs on either)."""
    if sys.platform == "win32":
        asyncio.run(main)
    else:
        import uvloop

        uvloop.run(main)


def ray_port_args(settings: HeadSettings) -> list[str]:
    """`ray start` options for the Ray ports the user pinned."""
    pinned = [("--node-manager-port", settings.ray_node_manager_port),
              ("--object-manager-port", settings.ray_object_manager_port),
              ("--min-worker-port", settings.ray_min_worker_port), ("--max-worker-port", settings.ray_max_worker_port)]
    return [arg for option, port in pinned if port is not None for arg in (option, str(port))]


def build_server(settings: HeadSettings, tokens: Tokens, store: Store, dispatcher: Dispatcher, events: JobEvents,
                 tls: HeadTLS | None = None) -> tuple[grpc.aio.Server, DataLanes]:
    """The control plane: the five services on one gRPC server (call within the event loop that will run it).

    With TLS (unless settings.insecure; `tls` is loaded from the state folder when not given) it listens twice: on
    --port with server authentication only (joining agents and the CLI have no certificate), and on the mTLS port,
    where every client must present a certificate of the head's CA: joined agents beat there. (gRPC's server
    credentials either require client certificates or never ask for them, hence two ports.) With it, the data lanes
    (farm.head.data_lanes: the same DataService on the data port), started and stopped by the caller."""
    if tls is None and not settings.insecure:
        tls = head_tls(settings)
    tokens = tokens.for_server(settings)
    store.keep_join_token(DEFAULT_JOIN_TOKEN_ID, hash_token(tokens.join))
    server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=[AuthGate(
        tokens, store, dispatcher.takes_upload, datasets.ReadCredentials(settings.state_dir, store).admits)])
    agent_pb2_grpc.add_AgentServiceServicer_to_server(
        AgentServicer(store, tokens, settings, dispatcher.wake, tls, dispatcher.links, dispatcher.job_nodes.code_for),
        server)
    fleet_pb2_grpc.add_FleetServiceServicer_to_server(FleetServicer(store, tokens), server)
    job_pb2_grpc.add_JobServiceServicer_to_server(
        JobServicer(Jobs(store, dispatcher, events, settings), tokens), server)
    data = DataServicer(store, tokens, settings)
    data_pb2_grpc.add_DataServiceServicer_to_server(data, server)
    result_pb2_grpc.add_ResultServiceServicer_to_server(ResultServicer(dispatcher), server)
    lanes = DataLanes(settings, data, tls)
    if tls is None:
        server.add_insecure_port(f"{settings.host}:{settings.port}")
        return server, lanes
    identity = [(tls.server_key_pem, tls.server_chain_pem)]
    server.add_secure_port(f"{settings.host}:{settings.port}", grpc.ssl_server_credentials(identity))
    server.add_secure_port(f"{settings.host}:{settings.mtls_listen_port}", grpc.ssl_server_credentials(
        identity, root_certificates=tls.ca_pem, require_client_auth=True))
    return server, lanes


async def _serve(settings: HeadSettings, tokens: Tokens, on_ready: Callable[[str], None],
                 services: Sequence[HeadService] = ()) -> None:
    store = Store(settings.state_dir / "state.db")
    events = JobEvents()
    dispatcher = Dispatcher(store, settings, events.publish)
    tls = None if settings.insecure else head_tls(settings)
    tokens = tokens.for_server(settings)
    server, lanes = build_server(settings, tokens, store, dispatcher, events, tls)
    # Whatever started is stopped, in reverse, also when a later part fails to start (a dashboard port taken): a
    # gRPC server left running past the loop raises "Event loop is closed" when collected, and that, not the one-line
    # reason, became the last line of the log that `farm head start --detach` shows.
    async with contextlib.AsyncExitStack() as started:
        started.callback(store.close)
        started.callback(store.save_heartbeats)
        await server.start()
        started.push_async_callback(server.stop, 2)
        await asyncio.to_thread(lanes.start)
        started.push_async_callback(asyncio.to_thread, lanes.stop)
        served: dict[str, str] = {}
        for service in services:  # a Jobs of their own: it holds no state apart from the parts it is built from
            served.update(await service.start(store, Jobs(store, dispatcher, events, settings), tokens, tls))
            started.push_async_callback(service.stop)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        started.callback(asyncio.create_task(dispatcher.run()).cancel)
        started.callback(asyncio.create_task(save_heartbeats(store, settings.heartbeat_save_s)).cancel)
        # What start-up made (Ray, gRPC, pydantic's schemas: ~100k objects) lives as long as the head: keep it out
        # of the collector's full passes, which otherwise stall the event loop (and every heartbeat) for a large
        # fleet.
        gc.freeze()
        write_json(settings.info_path, {
            **this_process(), "address": settings.address, "ray_address": settings.ray_address,
            "join_token": tokens.join, "api_token": tokens.api, "version": __version__, "started_at": time.time(),
            "tls": tls is not None, "ca_hash": tls.ca_hash if tls else "",
            "ca": str(settings.tls_dir / "ca.pem") if tls else "",
            "mtls_port": settings.mtls_listen_port if tls else 0, "data_address": settings.data_address,
            "bulk_address": settings.bulk_address, **served,
        })  # 0600, as every state file: it holds the tokens
        log.info("head listening on %s:%d (%s)", settings.host, settings.port,
                 f"TLS; mutual TLS for agents on {settings.mtls_listen_port}" if tls else "without TLS: --insecure")
        on_ready(join_command(settings.address, tokens.join, tls.ca_hash if tls else ""))
        await stopping.wait()
        log.info("stopping")


async def save_heartbeats(store: Store, every_s: float, chunk: int = 250) -> None:
    """Heartbeats live in memory (farm.head.liveness); this writes them to the store every period, in transactions
    of `chunk` nodes with the event loop free in between: thousands of rows at once would hold up every beat
    arriving meanwhile for tens of milliseconds."""
    while True:
        await asyncio.sleep(every_s)
        unsaved = store.liveness.take_unsaved()
        for start in range(0, len(unsaved), chunk):
            try:
                store.save_heartbeats(unsaved[start:start + chunk])
            except sqlite3.Error:  # a locked or full disk must not end the saving; the offline check reads memory
                log.exception("saving heartbeats")
            await asyncio.sleep(0)
