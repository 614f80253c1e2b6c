"""The node agent daemon: register, heartbeat, take the head's work over the node's work stream and run it in
persistent workers (farm_agent.daemon.workers), leave cleanly. A trusted node (the head operator's own) also joins the
head's Ray cluster as a worker node, for training; a lent node never learns that cluster's address or token.

When the owner needs the machine (the idle policy says busy) the node drains: the head gives it no new shards
(it sees `busy` in the heartbeats), and once the owner has been busy for `drain_grace_s` the agent stops its workers
(and a trusted node's Ray node), so that the head takes back the shards still running there (each is re-queued
once). When the owner is idle again the node offers work again.

It stays light on purpose (no torch): shards run in the worker processes it starts, not in the daemon.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import re
import signal
import subprocess
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import psutil

from farm import ray_user
from farm.core.errors import AgentError, AuthError, FarmError, UserError
from farm.core.models import BackendName, BackendOffer, Hardware
from farm.local import (
    RayProcess, keep_private, local_ip_towards, python_command, ray_temp_dir, read_json, this_process, write_json,
    write_private,
)
from farm.proto.v1 import agent_pb2, common_pb2
from farm_agent.daemon.backoff import Backoff
from farm_agent.daemon.client import NODE_KEY_FILE, HeadClient, pin_head_ca
from farm.core.ids import NODE_LABEL
from farm_agent.daemon.idle import IdlePolicy
from farm_agent.power import PowerMeter, ReadsMemory, idle_power, meter_for
from farm_agent.daemon.settings import AgentSettings
from farm_agent.daemon.workers import Workers

log = logging.getLogger("farm.agent")

# How long Ray's own shutdown may take when the owner's grace has run out, in seconds. Ray's drain would let running
# tasks go on (~20 s here); the owner wants the machine back now and the shards had their grace: what is left of the
# node is killed, and the head re-queues its shards.
PAUSE_STOP_S = 2.0
# A Ray node that exits on its own is started again (after a new Register) this many times within the window; then
# the agent leaves and says why.
REJOINS_ALLOWED = 3
NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # as farm.core.ids makes them (n-1a2b3c4d)
REJOIN_WINDOW_S = 600.0
MAX_CODE_PACKAGE = 512 * 1024 * 1024  # a job's code package, as the head sends it, at most


class Agent:
    hardware: Hardware  # found by run(), before the first Register
    offers: list[BackendOffer]
    address: str  # the address this machine's Ray node binds

    def __init__(self, settings: AgentSettings, ray_account: pwd.struct_passwd | None = None) -> None:
        """`ray_account`: the user the Ray node runs as (see ray_account()); None: the agent's own."""
        self.settings = settings
        self.ray_account = ray_account
        # TLS, with the head's CA pinned; the node's key is made by a child (no `cryptography` in the daemon).
        self.client = HeadClient(settings.head, pin_head_ca(settings), settings.state_dir / NODE_KEY_FILE)
        self.stopping = asyncio.Event()
        self.node_id = ""
        self.node_token = ""
        self.interval = 2.0
        self.ray: RayProcess | None = None
        self.ray_args: list[str] = []
        self.ray_failure: AgentError | None = None
        # The agent stopped its workers (and Ray node) on purpose: the owner busy past the grace.
        self.ray_paused = False
        self.workers: Workers | None = None
        self.reports: asyncio.Queue[agent_pb2.WorkReport] = asyncio.Queue()
        self.order_tasks: set[asyncio.Task[None]] = set()
        self.ray_rejoins: deque[float] = deque()  # time.monotonic() of each start of a node after one died
        self.ray_change: asyncio.Task[None] | None = None  # a stop or restart of the Ray node under way
        self.busy_since: float | None = None  # time.monotonic() when the owner became busy; None while idle
        self.meters: dict[str, PowerMeter] = {}
        self.status: dict[str, object] = {}
        self.idle = IdlePolicy(settings.max_foreign_cpu, busy_file=settings.busy_file)

    async def run(self) -> None:
        settings = self.settings
        hardware, offers, no_gpus_because = await probe_machine(settings.cpus)
        offers = lent_offers(offers, settings.backends)
        # Before the Ray node starts, so that nothing of Farm's runs on the devices while their idle draw is read.
        self.meters = {o.device: meter_for(o.device) for o in offers if o.available}
        self.hardware, self.offers = hardware, await with_meter_facts(offers, self.meters)
        host = urlsplit(f"//{settings.head}").hostname or "127.0.0.1"
        self.address = local_ip_towards(host)
        await self._register()
        # Logged once registered, not as they are found: a refused join is then the one line that says why.
        if not hardware.gpus:
            log.info("no NVIDIA GPUs: %s", no_gpus_because)
        for meter in self.meters.values():
            if meter.reason:
                log.info("%s power: %s", meter.device, meter.reason)
        for offer in self.offers:
            if offer.idle_w is not None:
                log.info("%s idle: %.1f W (%s)", offer.device, offer.idle_w, offer.idle_source)
        self.ray = self._new_ray() if self.ray_args else None  # a trusted node's only
        self.workers = Workers(self.node_id, settings.state_dir, self.ray_account, self.reports.put_nowait,
                               self._fetch_code, settings.keep_warm_s,
                               warm_beside_jobs=(os.cpu_count() or 1) > settings.cpus)
        for offer in self.offers:  # a GPU's first job would wait seconds for torch and its context
            if offer.available and offer.name in (BackendName.CUDA, BackendName.MPS):
                self.workers.keep_warm(offer.device)
        working: asyncio.Task[None] | None = None
        try:
            if self.ray is not None:
                # In a thread, so that a SIGTERM during Ray's start-up is heard and the half-started node is stopped.
                starting = asyncio.create_task(asyncio.to_thread(self.ray.start))
                stopped = asyncio.create_task(self.stopping.wait())
                await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if self.stopping.is_set():
                    return
                if not self.ray.running:
                    raise self.ray.failure()
            self.status = {
                **this_process(), "name": settings.name, "node_id": self.node_id, "head": settings.head,
                "started_at": time.time(), "state": "joining", "trusted": bool(self.ray_args),
                "ray_pid": self.ray.proc.pid if self.ray is not None and self.ray.proc else 0,
            }
            write_json(settings.status_path, self.status)
            working = asyncio.create_task(self._work_until_stopped())
            await self._heartbeat_until_stopped()
            if self.ray_failure is not None:
                raise self.ray_failure
        finally:
            if working is not None:
                working.cancel()
                await asyncio.gather(working, return_exceptions=True)
            await self.workers.close()
            if self.ray is not None:
                self.ray.stop()  # a restart under way in a thread sees `stopped` and stops the node it starts
            if self.ray_change is not None:
                await asyncio.gather(self.ray_change, return_exceptions=True)
            await self.client.deregister(self.node_id, self.node_token)
            await self.client.close()
            settings.status_path.unlink(missing_ok=True)
            log.info("stopped")

    async def _register(self) -> None:
        """Register (again: as the node this machine is, proven by its certificate) and note how to join Ray.

        A node that joined before joins again on its own credentials, with no join token (an agent started again,
        a machine rebooted, a Ray node that exited with its cluster): its join token may have expired or been revoked
        since, and nodes that joined stay. Refused (an operator forgot the node), it falls back on the join token
        when it was given one."""
        settings = self.settings
        identity = read_json(settings.identity_path) or {}
        node_id, node_token = str(identity.get("node_id", "")), str(identity.get("node_token", ""))
        mtls_port = int(identity.get("mtls_port", 0))
        reply = None
        if node_id and node_token:
            try:
                reply = await self.client.register("", settings.name, self.hardware, self.offers, self.address,
                                                   node_id, node_token, mtls_port, settings.admin_token)
            except AuthError as exc:
                if not settings.token:
                    raise AuthError(f"{exc.message}; give a join token (FARM_JOIN_TOKEN=... or --token-file) to "
                                    "join afresh") from None
                log.warning("%s; joining with the join token", exc.message)
        elif not settings.token:
            raise AgentError(f"node {settings.name!r} has not joined a head yet (no {settings.identity_path}): "
                             "give the join token")
        if reply is None:
            reply = await self.client.register(settings.token, settings.name, self.hardware, self.offers,
                                               self.address, node_id, node_token, mtls_port, settings.admin_token)
        if not NODE_ID.fullmatch(reply.node_id):  # it names this node's folders (ray_temp_dir): no path in it
            raise AgentError(f"the head gave this node an id that is not one: {reply.node_id[:80]!r}")
        self.node_id, self.node_token, self.interval = reply.node_id, reply.node_token, reply.heartbeat_interval_s
        # 0600: the node token (its proof at the next Register, and with TLS where to prove it with its certificate)
        # and the head it joined, which `farm agent start` without --head joins again
        write_json(settings.identity_path, {"node_id": self.node_id, "node_token": self.node_token,
                                            "mtls_port": reply.mtls_port, "head": settings.head})
        log.info("registered with %s as node %s%s", settings.head, self.node_id,
                 " (trusted: joining the head's Ray)" if reply.ray_address else "")
        if settings.trusted and not reply.ray_address:
            raise AgentError("the head did not take this node as trusted (it gave no Ray address)")
        if not reply.ray_address:  # a lent node: no Ray of the head's, and no token of it kept from before
            settings.ray_token_path.unlink(missing_ok=True)
            self.ray_args = []
            return
        write_private(settings.ray_token_path, reply.ray_token.encode())
        resources: dict[str, int] = {}  # summed per backend: a 2-GPU node offers farm.cuda=2
        for o in self.offers:
            if o.available and o.slots:
                resources[f"farm.{o.name.value}"] = resources.get(f"farm.{o.name.value}", 0) + o.slots
        self.ray_args = [
            "--address", reply.ray_address, "--node-ip-address", self.address, "--num-cpus", str(settings.cpus),
            "--num-gpus", str(len(self.hardware.gpus)), "--resources", json.dumps(resources),
            "--labels", f"{NODE_LABEL}={self.node_id}",
            "--object-store-memory", str(settings.object_store_mb * 1024 * 1024),
        ]

    def _new_ray(self) -> RayProcess:
        return RayProcess(self.ray_args, self.settings.ray_token_path, self.settings.state_dir / "ray.log",
                          record=self.settings.state_dir / "ray-node.json", user=self.ray_account,
                          folder=ray_temp_dir(self.node_id))  # its own, not the head's: see ray_temp_dir

    async def _fetch_code(self, job_id: str) -> bytes:
        return await self.client.code(self.node_id, self.node_token, job_id, limit=MAX_CODE_PACKAGE)

    async def _work_until_stopped(self) -> None:
        """The node's work stream, opened again whenever it closes: the head's orders run here, the workers'
        reports go back. While it is closed the head takes this node's shards back, so its workers stop too."""
        backoff = Backoff()
        while not self.stopping.is_set():
            self.reports = asyncio.Queue()
            reports = self.reports
            hello = agent_pb2.WorkReport(hello=agent_pb2.WorkHello(node_id=self.node_id, node_token=self.node_token))

            # Consumed within this round (the call below), so the loop's variables are this round's.
            async def outgoing() -> AsyncIterator[agent_pb2.WorkReport]:
                yield hello  # noqa: B023
                while True:
                    yield await reports.get()  # noqa: B023

            assert self.workers is not None
            self.workers.report = reports.put_nowait
            call = self.client.work(outgoing(), self.node_id, self.node_token)
            try:
                async for order in call:
                    backoff.reset()
                    self._follow_order(order)
            except grpc.aio.AioRpcError as exc:
                if self.stopping.is_set():
                    return
                log.warning("work stream lost (%s)", exc.code().name)
            finally:
                call.cancel()
                await self.workers.stop_all("its node's work stream closed")
            try:
                await asyncio.wait_for(self.stopping.wait(), backoff.next_delay())
            except TimeoutError:
                pass

    def _follow_order(self, order: agent_pb2.WorkOrder) -> None:
        assert self.workers is not None
        which = order.WhichOneof("order")
        if which == "assign":
            job = self.workers.assign(order.assign)
        elif which == "cancel":
            job = self.workers.cancel(order.cancel.job_id, order.cancel.ticket, order.cancel.run)
        else:
            return
        task = asyncio.create_task(job)
        self.order_tasks.add(task)
        task.add_done_callback(self.order_tasks.discard)

    async def _heartbeat_until_stopped(self) -> None:
        backoff = Backoff()  # a lost head is tried again after waits that grow and spread (see backoff.py)
        while not self.stopping.is_set():
            call = self.client.heartbeats(self._beats(), self.node_id, self.node_token)
            try:
                async for reply in call:
                    backoff.reset()
                    if reply.state != self.status["state"]:  # `farm agent start --detach` waits on this
                        self.status["state"] = reply.state
                        write_json(self.settings.status_path, self.status)
            except grpc.aio.AioRpcError as exc:
                if self.stopping.is_set():
                    return
                delay = backoff.next_delay()
                log.warning("heartbeat stream lost (%s); retrying in %.1f s", exc.code().name, delay)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                continue  # not this task: a new Register closed the stream's channel; beat on the new one
            else:
                delay = backoff.next_delay()  # the head ended the stream: as lost, though it answered before
            try:
                await asyncio.wait_for(self.stopping.wait(), delay)
            except TimeoutError:
                pass

    async def _beats(self) -> AsyncIterator[agent_pb2.HeartbeatRequest]:
        while not self.stopping.is_set():
            ray = self.ray
            if ray is not None and not self.ray_paused and not ray.running:
                self._ray_died(ray)
                if self.stopping.is_set():
                    return
            busy = self.idle.busy()
            if busy != self.status.get("busy", ""):
                log.info("owner %s", f"busy: {busy}; taking no new shards" if busy else "idle again; offering work")
                self.status["busy"] = busy
            self._follow_owner(busy)
            yield agent_pb2.HeartbeatRequest(
                node_id=self.node_id, node_token=self.node_token, cpu_percent=self.idle.machine_percent,
                memory_percent=psutil.virtual_memory().percent, ray_running=not self.ray_paused, power=self._power(),
                busy=busy, farm_cpu_percent=self.idle.farm_percent, gpu_memory=gpu_memory(self.meters),
            )
            try:
                await asyncio.wait_for(self.stopping.wait(), self.interval)
            except TimeoutError:
                pass

    def _ray_died(self, ray: RayProcess) -> None:
        """The Ray node exited on its own. Its cluster's head was most often restarted (a raylet whose GCS came
        back without it exits): register again and start a new node, a few times a while; past that, leave and
        say why (no work without it)."""
        now = time.monotonic()
        while self.ray_rejoins and self.ray_rejoins[0] < now - REJOIN_WINDOW_S:
            self.ray_rejoins.popleft()
        if len(self.ray_rejoins) >= REJOINS_ALLOWED or self.ray_change is not None and not self.ray_change.done():
            if len(self.ray_rejoins) >= REJOINS_ALLOWED:
                self.ray_failure = ray.failure()
                self.stopping.set()
            return
        self.ray_rejoins.append(now)
        log.warning("the Ray node exited (%s); registering again and starting a new one", ray.failure().message)
        self.ray_paused = True  # until the new node runs: beats say so, and the owner's logic leaves it alone
        self.ray_change = asyncio.create_task(self._rejoin(ray))

    async def _rejoin(self, exited: RayProcess) -> None:
        await asyncio.to_thread(exited.stop, PAUSE_STOP_S)  # what its jobs left running, its folder
        try:
            await self._register()
        except FarmError as exc:
            self.ray_failure = AgentError(f"the Ray node exited and registering again failed: {exc.message}")
            self.stopping.set()
            return
        self.ray = self._new_ray()
        await self._restart_ray(self.ray)

    def _follow_owner(self, busy: str) -> None:
        """Stop the workers (and a trusted node's Ray node) once the owner has been busy for the grace; offer work
        again once they are idle. Each change runs in a task (a Ray node takes seconds to stop or start) while the
        heartbeats go on."""
        if self.ray_change is not None and not self.ray_change.done():
            return
        now = time.monotonic()
        if busy:
            self.busy_since = now if self.busy_since is None else self.busy_since
            if not self.ray_paused and now - self.busy_since >= self.settings.drain_grace_s:
                log.info("owner busy for %.0f s (grace %.0f s): stopping the workers; the head takes back their "
                         "shards", now - self.busy_since, self.settings.drain_grace_s)
                self.ray_paused = True
                self.ray_change = asyncio.create_task(self._pause(self.ray))
        else:
            self.busy_since = None
            if self.ray_paused:
                log.info("owner idle again: offering work")
                if self.ray is None:
                    self.ray_paused = False
                    return
                self.ray = self._new_ray()  # set first: a stop meanwhile (SIGTERM) reaches the node being started
                self.ray_change = asyncio.create_task(self._restart_ray(self.ray))

    async def _pause(self, ray: RayProcess | None) -> None:
        if self.workers is not None:
            await self.workers.stop_all("its node drained (its owner needs it)")
        if ray is not None:
            await asyncio.to_thread(ray.stop, PAUSE_STOP_S)
            self._write_status(ray_pid=0)

    async def _restart_ray(self, ray: RayProcess) -> None:
        await asyncio.to_thread(ray.start)
        if self.stopping.is_set():
            return
        if not ray.running:
            self.ray_failure = ray.failure()
            self.stopping.set()
            return
        self.ray_paused = False
        self._write_status(ray_pid=ray.proc.pid if ray.proc else 0)

    def _write_status(self, **changes: object) -> None:
        self.status.update(changes)
        write_json(self.settings.status_path, self.status)

    def _power(self) -> list[common_pb2.DevicePower]:
        readings = []
        for device, meter in self.meters.items():
            power = meter.power()
            if power is not None:
                readings.append(common_pb2.DevicePower(device=device, watts=power.watts, source=power.source.value,
                                                       scope=power.scope.value))
        return readings


def gpu_memory(meters: dict[str, PowerMeter]) -> list[common_pb2.GpuMemory]:
    """Each lent GPU's memory, where its meter reads it (NVML); none for a device whose meter does not."""
    found = []
    for device, meter in meters.items():
        read = meter.memory() if isinstance(meter, ReadsMemory) else None
        if read is not None:
            found.append(common_pb2.GpuMemory(device=device, used_bytes=read[0], total_bytes=read[1]))
    return found


async def with_meter_facts(offers: list[BackendOffer], meters: dict[str, PowerMeter]) -> list[BackendOffer]:
    """Each offer with its meter's step and the device's idle draw on that meter, read on every device at once
    (a GPU's takes 20 counter steps, 2 s on an H200). The head sizes shards by the step and takes the idle draw off
    each shard's energy (its marginal energy)."""

    async def facts(offer: BackendOffer) -> BackendOffer:
        meter = meters.get(offer.device)
        if meter is None:
            return offer
        idle = await asyncio.to_thread(idle_power, meter)
        step_s = await asyncio.to_thread(lambda: meter.step_s)
        return offer.model_copy(update={
            "meter_step_s": step_s, "idle_w": None if idle is None else idle.watts,
            "idle_source": "" if idle is None else idle.source.value,
        })

    return list(await asyncio.gather(*(facts(o) for o in offers)))


def lent_offers(offers: list[BackendOffer], lent: frozenset[BackendName] | None) -> list[BackendOffer]:
    """The offers the owner lends: the others stay listed, unavailable, so `farm nodes` says why they take no work."""
    if lent is None:
        return offers
    return [o if o.name in lent or not o.available else
            o.model_copy(update={"available": False, "reason": "not lent by the owner (--backends)"}) for o in offers]


async def probe_machine(cpus: int) -> tuple[Hardware, list[BackendOffer], str]:
    """This machine's hardware, its backend offers, and why it has no NVIDIA GPUs if so, found by a child process
    (`python -m farm_agent --probe`): the backend modules imported to find the offers (numpy, and torch where a
    backend checks its device) would otherwise stay resident in the daemon for its whole life."""
    done = await asyncio.to_thread(
        subprocess.run, python_command("farm_agent", "--probe", "--cpus", str(cpus)), capture_output=True,
        text=True, timeout=300, check=False,
    )
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise AgentError(f"cannot detect this machine's hardware and backends: {last[0]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return (Hardware.model_validate(found["hardware"]), [BackendOffer.model_validate(o) for o in found["offers"]],
            str(found["no_gpus_because"]))


def private_state_dir(folder: Path) -> None:
    """The agent's folder, 0700 and this user's: its join token, node key and node token, which job code (another
    user, see ray_account) must not read. One that belongs to someone else is refused: its owner could swap the
    files in it."""
    owner = folder.stat().st_uid if folder.exists() else os.geteuid()
    if owner != os.geteuid():
        raise UserError(f"{folder} belongs to uid {owner}, not to this agent's user (uid {os.geteuid()}): "
                        "choose another --state-dir, or give it to this user")
    keep_private(folder)  # 0700, its files 0600


def ray_account(settings: AgentSettings) -> pwd.struct_passwd | None:
    """The user the node's Ray runs as, made if missing (farm.ray_user), and able to reach this Python and the
    packages its workers import to run shards; None: the agent's own."""
    if settings.ray_user is None:
        return None
    user = ray_user.ensure(settings.ray_user)
    ray_user.check_reachable(user, worker_packages())
    return user


def worker_packages() -> list[Path]:
    """The folders of the packages a node's workers import to run shards (farm, farm_agent)."""
    import farm
    import farm_agent

    return [Path(farm.__file__).parent, Path(farm_agent.__file__).parent]


def serve(settings: AgentSettings) -> None:
    """Run the agent in the foreground until SIGTERM or SIGINT."""
    private_state_dir(settings.state_dir)
    account = ray_account(settings)

    async def main() -> None:
        agent = Agent(settings, account)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.stopping.set)
        await agent.run()

    asyncio.run(main())
