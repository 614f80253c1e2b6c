"""The dashboard's HTTP server (aiohttp), run on the head's event loop in the head's process.

    GET  /                        the page (static/index.html; its assets under /static/, nothing from elsewhere)
    GET  /api/fleet               nodes, totals, nodes per backend
    GET  /api/jobs                the latest jobs with their progress
    GET  /api/jobs/{id}           a job: shard placement, seconds and energy per shard, the scheduler's explanation
    GET  /api/jobs/{id}/logs      its log lines after ?after=ID (?shard=N: one shard's), what shards printed too;
                                  needs the API token
    GET  /api/nodes/{node}        a node (id or name): its figures, backends, hardware, the work it did and its own
                                  last 15 minutes (CPU, Farm's and the owner's, memory, power)
    GET  /api/history             the last 15 minutes of utilisation, memory and power per node
    GET  /api/events              server-sent events: a `tick` (fleet, jobs, the new sample) every few seconds
    GET  /api/auth                204 with a valid API token (bearer), 401 without: what the sign-in form checks
    POST /api/jobs/{id}/cancel    cancel a job, through the same code as the gRPC Cancel; needs the API token
    POST /api/nodes/{node}/drain  drain a node (id or name): no new shards, what runs finishes; needs the API token
    POST /api/nodes/{node}/undrain   let it take shards again; needs the API token
    GET  /metrics                 Prometheus

Served over TLS with the head's certificate (its CA is the one agents pin), unless the head runs --insecure or the
dashboard was asked for plain HTTP on loopback. Everything but the page and its assets needs the API token
(`Authorization: Bearer <API token>`, the token in the head's head.json), as gRPC's calls do: reading too, unless the
head runs with --open-read. A wrong token counts against its sender's address in the head's one failure limiter
(farm.head.auth), shared with gRPC, and is logged so, escaped; a request with no token is refused uncounted (it
guesses nothing: a page opened before signing in).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import socket
import ssl
import time
from collections.abc import Callable, Collection
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from farm.core.errors import AuthError, ConflictError, FarmError, NotFoundError, UserError
from farm.core.models import JobState, Node
from farm.dashboard import metrics
from farm.dashboard.history import History, Reading
from farm.dashboard.views import (LIVE_STATES, fleet_view, gpu_memory_percent, job_summary, job_view, log_view,
                                  node_view, perf_by_model)
from farm.head.auth import Tokens
from farm.head.jobs import Jobs
from farm.head.store import Job, NodeWork, Store
from farm.local import bound, on_loopback, picked_ports
from farm.tls import HeadTLS

log = logging.getLogger("farm.dashboard")

STATIC = resources.files("farm.dashboard") / "static"
JOBS_SHOWN = 50
LOG_LINES = 2000  # a job page's log fetch: at most this many lines at a time (it fetches the rest after them)
LOOP_SHARE = 10  # a tick that took t seconds waits at least LOOP_SHARE × t for the next
HTTP_STATUS = {AuthError: 401, NotFoundError: 404, ConflictError: 409, UserError: 400}
# The page loads nothing from elsewhere: it works offline, and injected markup could not fetch anything either.
CSP = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'"


def reserve_port(host: str, requested: int | None, default: int, avoid: Collection[int] = ()) -> socket.socket:
    """The dashboard's socket, bound now and held until it listens: on the port asked for (0: any free one), which
    must be free; else on `default` when it is free and not in `avoid` (the head's other ports, bound later), else on
    any free one, so that a busy default never stops a head from starting. Bound rather than only checked: between
    the pick and the dashboard's start the head starts Ray, which binds ports of its own, and a port taken in that
    moment failed the head's start."""
    if requested is not None and requested != 0:
        sock = bound(host, requested, reuse=True)
        if sock is None:
            raise UserError(f"cannot listen on port {requested} (--dashboard-port): it is in use")
        return sock
    first = [default] if requested is None and default not in avoid else []
    for port in itertools.chain(first, picked_ports(avoid)):
        sock = bound(host, port, reuse=True)
        if sock is not None:
            return sock
    raise UserError(f"no free port for the dashboard on {host}")


def check_plain_http(host: str, plain_http: bool) -> None:
    if plain_http and not on_loopback(host):
        raise UserError(f"--dashboard-http: the dashboard serves plain HTTP only on loopback (--host 127.0.0.1), not "
                        f"on {host}: signing in would send the API token in the clear")


class Feed:
    """The latest tick, handed to every open page's event stream: built once however many pages are open, and only
    while one is (at thousands of nodes a tick is megabytes of JSON)."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self.seq = 0
        self.payload = b""
        self.closed = False
        self.watchers = 0
        self.wanted = asyncio.Event()  # a page has just opened: it wants a tick now, not at the next period

    async def publish(self, payload: bytes) -> None:
        async with self._changed:
            self.seq += 1
            self.payload = payload
            self._changed.notify_all()

    async def next(self, seen: int) -> tuple[bytes | None, int]:
        """The first tick after `seen` (None once the dashboard stops)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.closed or self.seq > seen)
            return (None if self.closed else self.payload), self.seq

    async def close(self) -> None:
        async with self._changed:
            self.closed = True
            self._changed.notify_all()


class Dashboard:
    """The head's web dashboard and /metrics: a service the entry point hands to `farm.head.server.serve`."""

    def __init__(self, host: str, port: int | socket.socket, advertise: str, sample_every_s: float = 2.0,
                 plain_http: bool = False) -> None:
        """`port`: a number, or a socket bound to it (reserve_port), on which it then listens. `plain_http`: no TLS
        although the head has it, only where the dashboard listens on loopback (a token signed in over plain HTTP
        crosses the network in the clear)."""
        check_plain_http(host, plain_http)
        self.host = host
        if isinstance(port, socket.socket):
            self.reserved: socket.socket | None = port
            self.port: int = port.getsockname()[1]
        else:
            self.reserved, self.port = None, port
        self.advertise = advertise
        self.sample_every_s = sample_every_s
        self.plain_http = plain_http
        self.ssl: ssl.SSLContext | None = None  # the head's certificate, from start()
        self.history = History(sample_every_s)
        self.feed = Feed()
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl else 'http'}://{self.advertise}:{self.port}/"

    async def start(self, store: Store, jobs: Jobs, tokens: Tokens, tls: HeadTLS | None = None) -> dict[str, str]:
        """`tls`: the head's; None for a head run --insecure (it then serves plain HTTP, as its gRPC)."""
        self.store, self.jobs, self.tokens = store, jobs, tokens
        self.ssl = tls.server_context() if tls is not None and not self.plain_http else None
        await self.sample()  # the charts start with a point
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        try:
            site = (web.SockSite(self._runner, self.reserved, ssl_context=self.ssl) if self.reserved
                    else web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl))
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise UserError(f"the dashboard cannot listen on {self.host}:{self.port}: {exc.strerror}") from None
        self._sampler = asyncio.create_task(self._sample_forever())
        log.info("dashboard at %s", self.url)
        return {"dashboard": self.url}

    async def stop(self) -> None:
        if self._sampler:
            self._sampler.cancel()
        await self.feed.close()  # ends the event streams, so the server stops without waiting on them
        if self._runner:
            await self._runner.cleanup()

    # ---- sampling

    async def _sample_forever(self) -> None:
        rest = 0.0
        while True:
            # The head's event loop serves thousands of agents first: a tick that took t seconds is followed by
            # LOOP_SHARE × t of rest, even for a page that opens meanwhile, so the dashboard keeps to a small share.
            await asyncio.sleep(rest)
            try:
                await asyncio.wait_for(self.feed.wanted.wait(), timeout=max(self.sample_every_s - rest, 0.0))
            except TimeoutError:
                pass
            self.feed.wanted.clear()
            started = time.monotonic()
            try:
                await self.sample()
            except Exception:  # one bad tick (a locked store, say) must not end the live view; the next may work
                log.exception("dashboard sample")
            rest = LOOP_SHARE * (time.monotonic() - started)

    async def sample(self) -> None:
        """Read the store once: add a tick to the history and, while a page is open, hand it the update."""
        now = time.time()
        if not self.feed.watchers:  # the history only: the light read and the beats in memory, no node table parse
            self.history.add(now, self._readings())
            return
        nodes = self.store.nodes()
        readings = {
            n.id: Reading(n.name, n.cpu_percent, sum(p.watts for p in n.power), n.memory_percent,
                          n.farm_cpu_percent, gpu_memory_percent(n.gpu_memory))
            for n in nodes if n.state in LIVE_STATES
        }
        self.history.add(now, readings)
        running, work = self.store.jobs(states=(JobState.RUNNING,)), self.store.work_by_node()
        jobs = self.store.jobs(limit=JOBS_SHOWN)
        payload = await asyncio.to_thread(_tick, now, nodes, running, work, jobs, readings)
        await self.feed.publish(payload)

    def _readings(self) -> dict[str, Reading]:
        """Each live node's latest load and power: what the history keeps, read without parsing the node table
        (77 ms at 5,000 nodes, every tick, on the loop that serves their heartbeats)."""
        readings = {}
        for node in self.store.node_liveness():
            beat = self.store.liveness.latest(node.id)
            if node.state in LIVE_STATES and beat is not None:
                readings[node.id] = Reading(node.name, beat.cpu_percent, sum(p.watts for p in beat.power),
                                            beat.memory_percent, beat.farm_cpu_percent,
                                            gpu_memory_percent(beat.gpu_memory))
        return readings

    # ---- HTTP

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors])
        app.on_response_prepare.append(_security_headers)
        app.add_routes([
            web.get("/", self.page),
            web.get("/api/fleet", self.fleet),
            web.get("/api/jobs", self.job_list),
            web.get("/api/jobs/{job_id}", self.job),
            web.get("/api/jobs/{job_id}/logs", self.job_logs),
            web.get("/api/nodes/{node}", self.node),
            web.post("/api/jobs/{job_id}/cancel", self.cancel),
            web.post("/api/nodes/{node}/drain", self.drain),
            web.post("/api/nodes/{node}/undrain", self.undrain),
            web.get("/api/history", self.history_view),
            web.get("/api/events", self.events),
            web.get("/api/auth", self.auth),
            web.get("/metrics", self.scrape),
            web.static("/static", str(STATIC)),
        ])
        return app

    async def page(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(str(STATIC / "index.html"))

    async def fleet(self, request: web.Request) -> web.Response:
        self._check_read(request)
        nodes, running = self.store.nodes(), self.store.jobs(states=(JobState.RUNNING,))
        work = self.store.work_by_node()
        return await _json_response(fleet_view, nodes, running, work, self.store.jobs(limit=JOBS_SHOWN))

    async def job_list(self, request: web.Request) -> web.Response:
        self._check_read(request)
        jobs = self.store.jobs(limit=_int_query(request, "limit", JOBS_SHOWN))
        return await _json_response(lambda: [job_summary(j) for j in jobs])

    async def job(self, request: web.Request) -> web.Response:
        self._check_read(request)
        return web.json_response(job_view(self.store.job(request.match_info["job_id"])))

    async def job_logs(self, request: web.Request) -> web.Response:
        """The job's log lines after `after` (a line's id), at most LOG_LINES; with `shard`, that shard's. What a
        job's code printed is the job's: reading it needs the API token, as `farm logs` does."""
        self._check_token(request)
        shard = request.query.get("shard", "")
        lines = self.store.logs(request.match_info["job_id"], int(shard) if shard.isdigit() else None,
                                _int_query(request, "after", 0, maximum=2**62))
        return await _json_response(log_view, lines[:LOG_LINES])

    async def node(self, request: web.Request) -> web.Response:
        """One node (id or name): its figures, its backends and hardware, the work it did, and its history."""
        self._check_read(request)
        node_id = self.store.node_id(request.match_info["node"])
        node = self.store.nodes(node_id)[0]
        running = self.store.running_shards_by_node().get(node.id, 0)
        work = [w for w in self.store.work_by_node() if w.node_id == node.id]
        models = perf_by_model(self.store.jobs(limit=JOBS_SHOWN), node.id)
        # Its own charts: what the head sampled of it over the window (the fleet's chart the busiest nodes only).
        history = self.history.series(time.time(), only=node.id)
        return web.json_response({**node_view(node, running, work, models), "history": history})

    async def cancel(self, request: web.Request) -> web.Response:
        self._check_token(request)
        return web.json_response(job_view(self.jobs.cancel(request.match_info["job_id"])))

    async def drain(self, request: web.Request) -> web.Response:
        return self._set_drain(request, True)

    async def undrain(self, request: web.Request) -> web.Response:
        return self._set_drain(request, False)

    def _set_drain(self, request: web.Request, drain: bool) -> web.Response:
        """Through the same store call as the gRPC DrainNode."""
        self._check_token(request)
        node = self.store.set_node_drain(request.match_info["node"], drain)
        log.info("node %s %s from the dashboard", node.name, "drained" if drain else "undrained")
        running = self.store.running_shards_by_node().get(node.id, 0)
        return web.json_response(node_view(node, running, []))

    async def history_view(self, request: web.Request) -> web.Response:
        self._check_read(request)
        return web.json_response(self.history.series(time.time(), limit=_int_query(request, "limit", 24)))

    async def auth(self, request: web.Request) -> web.Response:
        self._check_token(request)
        return web.Response(status=204)

    async def scrape(self, request: web.Request) -> web.Response:
        self._check_read(request)
        body = await asyncio.to_thread(metrics.exposition, metrics.read(self.store))  # read here, rendered off-loop
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def events(self, request: web.Request) -> web.StreamResponse:
        self._check_read(request)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        await stream.write(b"retry: 2000\n\n")  # after a head restart, the page reconnects within 2 s
        seen = self.feed.seq  # from the next tick on, which the sampler makes now for this page
        self.feed.watchers += 1
        self.feed.wanted.set()
        try:
            while True:
                payload, seen = await self.feed.next(seen)
                if payload is None:
                    break
                await stream.write(payload)
        except ConnectionError:  # the page went away
            pass
        finally:
            self.feed.watchers -= 1
        return stream

    def _check_read(self, request: web.Request) -> None:
        """Reading the fleet and the jobs: the API token, unless the head runs with --open-read."""
        if not self.tokens.open_read:
            self._check_token(request)

    def _check_token(self, request: web.Request) -> None:
        presented = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not presented:
            raise AuthError("invalid or missing API token")
        what = f"the dashboard's {request.method} {request.path[:200]!r}"  # the path is the client's: escaped
        self.tokens.check_api_from(request.remote or "unknown", presented, what)


def _tick(now: float, nodes: list[Node], running: list[Job], work: list[NodeWork], jobs: list[Job],
          readings: dict[str, Reading]) -> bytes:
    """One live update, as a server-sent event: the fleet, the latest jobs and the new sample."""
    update = {
        "fleet": fleet_view(nodes, running, work, jobs),
        "jobs": [job_summary(j) for j in jobs],
        "sample": {"t": now, "values": {i: [r.cpu_percent, r.power_w] for i, r in readings.items()},
                   "memory": {i: _finite(r.memory_percent) for i, r in readings.items()},
                   "farm_cpu": {i: _finite(min(r.farm_cpu_percent, r.cpu_percent)) for i, r in readings.items()},
                   "gpu_memory": {i: r.gpu_memory_percent for i, r in readings.items()
                                  if not math.isnan(r.gpu_memory_percent)}},
    }
    return f"event: tick\ndata: {json.dumps(update)}\n\n".encode()


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


async def _json_response(build: Callable[..., Any], *args: Any) -> web.Response:
    """Build and encode a reply off the event loop (pure work on what was read from the store): at thousands of
    nodes it takes a good part of a second."""
    text = await asyncio.to_thread(lambda: json.dumps(build(*args)))
    return web.Response(text=text, content_type="application/json")


def _int_query(request: web.Request, name: str, default: int, maximum: int = 1000) -> int:
    value = request.query.get(name, "")
    if not value:
        return default
    if not value.isdigit() or len(value) > 20 or not 0 < int(value) <= maximum:
        raise UserError(f"{name} must be a whole number from 1 to {maximum}")
    return int(value)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Farm's errors as JSON with the matching HTTP status, one line like the CLI's."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except FarmError as exc:
        status = next((code for cls, code in HTTP_STATUS.items() if isinstance(exc, cls)), 500)
        return web.json_response({"error": exc.message}, status=status)


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")

