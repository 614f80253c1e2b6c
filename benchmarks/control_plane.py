"""Control-plane load: one real head and N simulated agents heartbeating over real gRPC.

    python benchmarks/control_plane.py [--agents 5000] [--duration-s 300] [--interval-s 1] [--load native|python]
                                       [--json PATH]

Starts a head (`farm head start --insecure --detach` in a temporary state directory, its heartbeat interval set
through FARM_HEARTBEAT_INTERVAL_S; without TLS: a joined agent beats over mutual TLS, which would need a client
certificate per simulated agent), then --procs load-generator processes (this file with --generator), each one
asyncio loop (uvloop's) that:
  - registers its share of the agents through AgentService.Register with the head's real join token (a laptop-like
    hardware report and one cpu backend, as a real agent sends), --register-concurrency calls at a time;
  - opens one bidirectional Heartbeat stream per agent, --agents-per-channel streams on each shared channel (one
    HTTP/2 connection each), and beats every interval (the one the head gave in RegisterReply) at a random phase,
    each beat carrying the figures and one power reading, as a real agent's does;
  - times each beat's round trip on its stream: from just before the request is written to the reply being read.
With --load native (the default) the Python processes only register, and hand each agent, as it registers, to one
C++ process (heartbeat_load.cc, gRPC's callback API; compiled on first use, cached under ~/.cache/farm-bench) that
beats exactly as above at about a third of the CPU a beat costs the Python client: the load shares this machine's
cores with the head, and grpc.aio's own cost per beat (~300 µs on these cores) would otherwise take more of them than
the head does.
Meanwhile the parent samples the head process and, apart, its Ray processes once a second (psutil, CPU as % of one
core from cpu_times deltas), and polls the head's store for offline nodes; at the end it also counts every
`node ... is offline` transition in the head's log. Every simulated agent beats all along, so any node the head marks
offline is a false positive. The simulated agents start no Ray node: they stay `joining`, which the liveness check
treats exactly as `ready`.

The load generators run on the same machine and compete with the head for its cores: their CPU is reported too.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import hashlib
import json
import math
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import uvloop
from farm_agent.daemon.backoff import Backoff
from rich.console import Console
from rich.table import Table

from farm.client import find_head
from farm.local import free_port
from localfarm import LocalFarm, _farm_cli, report_cleanup  # noqa: E402  (benchmarks/ is the script's path)

HERE = Path(__file__).resolve().parent
RTT_P99_TARGET_MS = 100.0
LATE_S = 0.1  # a beat written this long after its slot counts as late (the generator fell behind)
FINISH_S = 10.0  # after the window, how long an agent's last beat may wait for its answer before it is cut off


# ---------------------------------------------------------------- the load generator (a separate process)


@dataclass
class GeneratorStats:
    registered: int = 0
    register_s: list[float] = field(default_factory=list)
    register_started: float = 0.0
    register_done: float = 0.0
    interval_s: float = 0.0
    sent: int = 0
    answered: int = 0
    late: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    rtt_s: array.array[float] = field(default_factory=lambda: array.array("d"))
    loop_lag_s: list[float] = field(default_factory=list)


def _register_request(join_token: str, name: str) -> Any:
    from farm.core.models import BackendName, BackendOffer, Hardware
    from farm.proto import convert
    from farm.proto.v1 import agent_pb2

    hardware = Hardware(hostname=name, os="linux", arch="x86_64", cpu_model="Simulated CPU", cpu_cores=8,
                        memory_bytes=16 * 2**30)
    offer = BackendOffer(name=BackendName.CPU, device="cpu", threads=8, detail="simulated")
    return agent_pb2.RegisterRequest(
        join_token=join_token, name=name, hardware=convert.hardware_to_pb(hardware),
        backends=[convert.offer_to_pb(offer)], agent_version="bench", address="127.0.0.1",
    )


async def _measure_loop_lag(stats: GeneratorStats, window: Window) -> None:
    """How late this process's event loop wakes up: its own lag inflates the round trips it measures."""
    await asyncio.sleep(max(0.0, window.start - time.monotonic()))
    while time.monotonic() < window.end:
        asked = time.monotonic()
        await asyncio.sleep(0.05)
        stats.loop_lag_s.append(time.monotonic() - asked - 0.05)


@dataclass
class Window:
    """The measured window (monotonic seconds): open-ended until every generator has registered its agents."""
    start: float = math.inf
    end: float = math.inf


async def _beat(stub: Any, node_id: str, node_token: str, interval_s: float, window: Window,
                stats: GeneratorStats) -> None:
    """One agent, from its registration on: a heartbeat stream, one beat per interval at a random phase; reopened
    after a loss, as a real agent does. Beats inside the window are counted and timed."""
    import grpc

    from farm.proto.v1 import agent_pb2, common_pb2

    power = common_pb2.DevicePower(device="cpu", watts=12.5, source="model-estimate", scope="package")
    request = agent_pb2.HeartbeatRequest(node_id=node_id, node_token=node_token, memory_percent=40.0,
                                         ray_running=True, power=[power])
    slot = time.monotonic() + random.uniform(0.0, interval_s)
    backoff = Backoff()  # as a real agent: a lost heartbeat stream is reopened after a growing, jittered wait
    while slot < window.end:
        call = stub.Heartbeat(metadata=(("authorization", f"Bearer {node_token}"), ("farm-node-id", node_id)))
        try:
            while slot < window.end:
                await asyncio.sleep(max(0.0, slot - time.monotonic()))
                request.cpu_percent = random.uniform(0.0, 30.0)
                sent = time.monotonic()
                measured = window.start <= slot < window.end
                if measured:
                    stats.sent += 1
                    stats.late += sent - slot > LATE_S
                await call.write(request)
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    raise ConnectionError("the head closed the heartbeat stream")
                backoff.reset()
                if measured:
                    stats.answered += 1
                    stats.rtt_s.append(time.monotonic() - sent)
                slot += interval_s
            await call.done_writing()
        except (grpc.aio.AioRpcError, ConnectionError) as exc:
            stats.errors[exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else type(exc).__name__] += 1
            call.cancel()
            await asyncio.sleep(backoff.next_delay())
            slot = max(slot + interval_s, time.monotonic())


async def _generate(args: argparse.Namespace) -> None:
    import grpc

    from farm.proto.v1 import agent_pb2_grpc

    stats = GeneratorStats()
    # One channel per --agents-per-channel agents; a local subchannel pool gives each its own TCP connection
    # (channels with equal arguments otherwise share one).
    channels = [grpc.aio.insecure_channel(args.address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(math.ceil(args.count / args.agents_per_channel))]
    stubs = [agent_pb2_grpc.AgentServiceStub(c) for c in channels]
    limit = asyncio.Semaphore(args.register_concurrency)
    window = Window()
    all_registered = asyncio.Event()

    async def agent(i: int) -> None:
        """Register, then beat at once, as a real agent would (the head's offline clock starts at Register)."""
        stub = stubs[i % len(stubs)]
        try:
            async with limit:
                started = time.monotonic()
                reply = await stub.Register(
                    _register_request(args.join_token, f"sim-{args.first + i:05d}"), timeout=60, wait_for_ready=True,
                    metadata=(("authorization", f"Bearer {args.join_token}"),))
                stats.register_s.append(time.monotonic() - started)
            stats.interval_s = reply.heartbeat_interval_s
            stats.registered += 1
            if args.print_agents:  # the native load beats for it, from now on
                print(f"A {reply.node_id} {reply.node_token}", flush=True)
        except grpc.aio.AioRpcError as exc:
            stats.errors[f"Register {exc.code().name}"] += 1
            return
        finally:
            if len(stats.register_s) + sum(v for k, v in stats.errors.items() if k.startswith("Register")) == args.count:
                stats.register_done = time.time()
                all_registered.set()
        if not args.print_agents:
            await _beat(stub, reply.node_id, reply.node_token, reply.heartbeat_interval_s, window, stats)

    stats.register_started = time.time()
    agents = [asyncio.create_task(agent(i)) for i in range(args.count)]
    try:  # an overloaded head may never register them all: measure what did register
        await asyncio.wait_for(all_registered.wait(), args.register_timeout_s)
    except asyncio.TimeoutError:
        stats.register_done = time.time()
    print(json.dumps({"registered": stats.registered}), flush=True)
    if args.print_agents:
        for channel in channels:
            await channel.close()
        Path(args.out).write_text(json.dumps({
            "registered": stats.registered, "register_s": stats.register_s, "register_started": stats.register_started,
            "register_done": stats.register_done, "interval_s": stats.interval_s, "errors": dict(stats.errors),
        }))
        return
    # The parent answers with the wall-clock time at which the measured window starts, once all have registered.
    start_wall = float(await asyncio.to_thread(sys.stdin.readline))
    window.start = time.monotonic() + (start_wall - time.time())
    window.end = window.start + args.duration_s
    lag = asyncio.create_task(_measure_loop_lag(stats, window))
    # Agents still waiting for an answer (or still registering) a while after the window are cut off: an
    # overloaded head may never answer them.
    _, unfinished = await asyncio.wait(agents, timeout=args.duration_s + (window.start - time.monotonic()) + FINISH_S)
    for task in unfinished:
        task.cancel()
    await asyncio.gather(*unfinished, return_exceptions=True)
    stats.errors.update({"cut off after the window": len(unfinished)} if unfinished else {})
    await lag
    for channel in channels:
        await channel.close()
    with open(args.out + ".rtt", "wb") as handle:
        stats.rtt_s.tofile(handle)
    Path(args.out).write_text(json.dumps({
        "registered": stats.registered, "register_s": stats.register_s, "register_started": stats.register_started,
        "register_done": stats.register_done, "interval_s": stats.interval_s, "sent": stats.sent,
        "answered": stats.answered, "late": stats.late, "errors": dict(stats.errors), "loop_lag_s": stats.loop_lag_s,
    }))


# ---------------------------------------------------------------- the parent: head, generators, sampling, table


class CpuSampler:
    """CPU (% of one core, from cpu_times deltas) and RSS of a set of processes, summed, one sample per call."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}
        self.last_at = time.monotonic()
        self.cpu: list[float] = []
        self.rss_mb: list[float] = []

    def sample(self, procs: list[psutil.Process]) -> None:
        now = time.monotonic()
        used, rss, seen = 0.0, 0.0, {}
        for proc in procs:
            try:
                times = proc.cpu_times()
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
            cpu_s = times.user + times.system
            used += cpu_s - self.last.get(proc.pid, cpu_s)  # a process new since the last sample counts from now
            seen[proc.pid] = cpu_s
        if self.last:
            self.cpu.append(100.0 * used / (now - self.last_at))
            self.rss_mb.append(rss / 2**20)
        self.last, self.last_at = seen, now


def _offline_now(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM nodes WHERE state='offline'").fetchone()[0])


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class InsecureHead(LocalFarm):
    """The head alone (the agents are simulated), started with --insecure: see the module's doc."""

    def _start(self) -> None:
        done = _farm_cli("head", "start", "--insecure", "--host", "127.0.0.1", "--port", str(free_port()),
                         "--ray-port", str(free_port()), "--state-dir", str(self.state), "--detach")
        if done.returncode != 0:
            raise RuntimeError(f"farm head start: {done.stderr.strip()}")
        self.head = find_head(state_dir=self.state)


NATIVE_TOOLS = ("g++", "pkg-config", "protoc", "grpc_cpp_plugin")
NATIVE_PACKAGES = "g++ pkg-config libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc"


class MissingTools(Exception):
    pass


def native_load() -> Path:
    """heartbeat_load.cc built against the system's gRPC C++ (Debian: libgrpc++-dev), once per version of its sources
    and of the library; the binary's path."""
    missing = [tool for tool in NATIVE_TOOLS if shutil.which(tool) is None]
    if missing or subprocess.run(["pkg-config", "--exists", "grpc++", "protobuf"], check=False).returncode != 0:
        what = ", ".join(missing) or "grpc++ in pkg-config"
        raise MissingTools(f"the native heartbeat load needs gRPC C++ and its tools (missing: {what}): "
                           f"apt-get install {NATIVE_PACKAGES}; or pass --load python")
    protos = HERE.parent / "protos"
    names = ["farm/proto/v1/agent.proto", "farm/proto/v1/common.proto"]
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "grpc++", "protobuf"], capture_output=True, text=True,
                           check=True).stdout.split()
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in [HERE / "heartbeat_load.cc", *(protos / n for n in names)])
                            + " ".join(flags).encode()).hexdigest()[:16]
    build = Path.home() / ".cache" / "farm-bench" / f"heartbeat_load-{digest}"
    binary = build / "heartbeat_load"
    if binary.exists():
        return binary
    build.mkdir(parents=True, exist_ok=True)
    subprocess.run(["protoc", f"-I{protos}", f"--cpp_out={build}", f"--grpc_out={build}",
                    f"--plugin=protoc-gen-grpc={shutil.which('grpc_cpp_plugin')}", *names], check=True)
    generated = [str(build / n.replace(".proto", suffix)) for n in names for suffix in (".pb.cc", ".grpc.pb.cc")]
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{build}", str(HERE / "heartbeat_load.cc"), *generated,
                    "-o", f"{binary}.tmp", *flags, "-lpthread"], check=True)
    os.replace(f"{binary}.tmp", binary)
    return binary


def _relay(gen: subprocess.Popen[str], native: subprocess.Popen[str], lock: threading.Lock, lines: list[str]) -> None:
    """A registrar's output: each agent it registered goes to the native load at once (it beats from then on, as a
    real agent does: the head's offline clock starts at Register); the rest is kept."""
    assert gen.stdout is not None and native.stdin is not None
    for line in gen.stdout:
        if line.startswith("A "):
            with lock:
                native.stdin.write(line)
                native.stdin.flush()
        else:
            lines.append(line)


def run(args: argparse.Namespace, console: Console, farms: list[LocalFarm], binary: Path | None) -> dict[str, Any]:
    """Start the head (appended to `farms`, which the caller stops) and the load; return the figures."""
    os.environ["FARM_HEARTBEAT_INTERVAL_S"] = str(args.interval_s)  # read by the head's settings
    with console.status("starting a head..."):
        farm = InsecureHead(agents=0, cpus=1)
        farms.append(farm)
        farm.__enter__()
    work = Path(tempfile.mkdtemp(prefix="farm-load-"))
    generators: list[subprocess.Popen[str]] = []
    native: subprocess.Popen[str] | None = None
    try:
        head = farm.head
        assert head is not None
        head_proc = psutil.Process(int(farm.head_json()["pid"]))
        shares = [args.agents // args.procs + (1 if i < args.agents % args.procs else 0) for i in range(args.procs)]
        firsts = [sum(shares[:i]) for i in range(args.procs)]
        if binary is not None:
            native = subprocess.Popen(
                [str(binary), head.address, str(args.interval_s), str(args.duration_s), str(args.agents_per_channel),
                 str(work / "native.json")], stdin=subprocess.PIPE, text=True)
        with console.status(f"registering {args.agents} agents from {args.procs} load generators..."):
            for i, (first, count) in enumerate(zip(firsts, shares, strict=True)):
                generators.append(subprocess.Popen(
                    [sys.executable, __file__, "--generator", f"--address={head.address}",
                     f"--join-token={head.join_token}", "--first", str(first), "--count", str(count), "--duration-s",
                     str(args.duration_s), "--agents-per-channel", str(args.agents_per_channel),
                     "--register-concurrency", str(args.register_concurrency), "--register-timeout-s",
                     str(args.register_timeout_s), "--out", str(work / f"gen-{i}.json"),
                     *(["--print-agents"] if native else [])],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                ))
            if native is not None:
                lock = threading.Lock()
                relays = [threading.Thread(target=_relay, args=(gen, native, lock, [])) for gen in generators]
                for relay in relays:
                    relay.start()
                for relay, gen in zip(relays, generators, strict=True):
                    relay.join()
                    if gen.wait() != 0:
                        raise RuntimeError(f"a load generator failed during registration ({gen.returncode})")
            else:
                for gen in generators:
                    line = gen.stdout.readline() if gen.stdout else ""
                    if not line:
                        raise RuntimeError(f"a load generator exited during registration ({gen.wait()})")
        start = time.time() + 1.0
        for proc in [native] if native is not None else generators:
            assert proc.stdin is not None
            proc.stdin.write(f"S {start}\n" if native is not None else f"{start}\n")
            proc.stdin.flush()
        head_cpu, ray_cpu, gen_cpu = CpuSampler(), CpuSampler(), CpuSampler()
        machine: list[float] = []  # every process on the machine, ours and others'

        offline_seen = 0
        gen_procs = [psutil.Process(g.pid) for g in ([native] if native is not None else generators)]
        psutil.cpu_percent(None)
        time.sleep(max(0.0, start - time.time()))
        with console.status(f"{args.agents} agents beating every {args.interval_s:g} s for {args.duration_s:g} s..."):
            end = start + args.duration_s
            tick = 0
            while time.time() < end:
                time.sleep(1.0)
                head_cpu.sample([head_proc])
                ray_cpu.sample(head_proc.children(recursive=True))
                gen_cpu.sample(gen_procs)
                machine.append(psutil.cpu_percent(None) * psutil.cpu_count())
                tick += 1
                if tick % 5 == 0:
                    offline_seen = max(offline_seen, _offline_now(farm.state / "state.db"))
            offline_at_end = _offline_now(farm.state / "state.db")
        with console.status("collecting the load generators' figures..."):
            for proc in [native] if native is not None else generators:
                if proc.wait(timeout=FINISH_S + 120) != 0:
                    raise RuntimeError(f"a load generator failed ({proc.returncode})")
        shutil.copy(farm.state / "head.log", work / "head.log")  # kept for a look at what went offline, and when
        went_offline = set(re.findall(r"node (\S+) is offline", (work / "head.log").read_text(errors="replace")))
    finally:
        for proc in [*generators, *([native] if native is not None else [])]:
            if proc.poll() is None:
                proc.kill()
    parts = [json.loads((work / f"gen-{i}.json").read_text()) for i in range(args.procs)]
    beats = [json.loads((work / "native.json").read_text())] if native is not None else parts
    rtt: list[float] = []
    for path in [work / "native.json.rtt"] if native is not None else [work / f"gen-{i}.json.rtt" for i in range(args.procs)]:
        values = array.array("d")
        values.frombytes(path.read_bytes())
        rtt.extend(values)
    register_s = [s for p in parts for s in p["register_s"]]
    errors: Counter[str] = Counter()
    for p in [*parts, *(beats if native is not None else [])]:
        errors.update(p["errors"])
    lag = [s for p in parts for s in p.get("loop_lag_s", [])]
    result = {
        "machine": f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "work": str(work), "agents": args.agents, "load": args.load, "load_generators": args.procs,
        "agents_per_channel": args.agents_per_channel, "duration_s": args.duration_s,
        "interval_s": parts[0]["interval_s"], "registered": sum(p["registered"] for p in parts),
        "registration_s": max(p["register_done"] for p in parts) - min(p["register_started"] for p in parts),
        "register_rtt_p50_ms": 1e3 * _percentile(register_s, 0.5),
        "register_rtt_p99_ms": 1e3 * _percentile(register_s, 0.99),
        "beats_expected": int(args.agents * args.duration_s / parts[0]["interval_s"]),
        "beats_sent": sum(b["sent"] for b in beats), "beats_answered": sum(b["answered"] for b in beats),
        "beats_late": sum(b["late"] for b in beats), "stream_errors": dict(errors),
        "rtt_p50_ms": 1e3 * _percentile(rtt, 0.5), "rtt_p99_ms": 1e3 * _percentile(rtt, 0.99),
        "rtt_max_ms": 1e3 * max(rtt, default=math.nan),
        "generator_loop_lag_p99_ms": 1e3 * _percentile(lag, 0.99),
        "offline_transitions": len(went_offline), "offline_max_polled": offline_seen, "offline_at_end": offline_at_end,
        "head_cpu_pct_mean": statistics.fmean(head_cpu.cpu), "head_cpu_pct_p95": _percentile(head_cpu.cpu, 0.95),
        # the head's mean CPU over the beats it answered per second (fewer than agents / interval when it falls behind)
        "head_cpu_us_per_beat": 1e4 * statistics.fmean(head_cpu.cpu) * args.duration_s
        / max(1, sum(b["answered"] for b in beats)),
        "head_rss_mb_end": head_cpu.rss_mb[-1], "head_rss_mb_max": max(head_cpu.rss_mb),
        "ray_cpu_pct_mean": statistics.fmean(ray_cpu.cpu), "ray_rss_mb_end": ray_cpu.rss_mb[-1],
        "ray_processes": len(head_proc.children(recursive=True)) if head_proc.is_running() else 0,
        "generators_cpu_pct_mean": statistics.fmean(gen_cpu.cpu), "generators_rss_mb_max": max(gen_cpu.rss_mb),
        "machine_cpu_pct_mean": statistics.fmean(machine),
        "others_cpu_pct_mean": statistics.fmean(machine) - statistics.fmean(head_cpu.cpu)
        - statistics.fmean(ray_cpu.cpu) - statistics.fmean(gen_cpu.cpu),
    }
    return result


def table(r: dict[str, Any]) -> Table:
    def met(ok: bool) -> str:
        return "[green]yes[/]" if ok else "[red]no[/]"

    out = Table(title=f"Control plane: {r['agents']:,} simulated agents beating every {r['interval_s']:g} s for "
                      f"{r['duration_s']:g} s (machine: {r['machine']})")
    for column in ("metric", "value", "target", "met?"):
        out.add_column(column, justify="left" if column == "metric" else "right")
    out.add_row("agents registered", f"{r['registered']:,} / {r['agents']:,}", "all", met(r["registered"] == r["agents"]))
    out.add_row("registration (all agents, wall)", f"{r['registration_s']:.1f} s", "", "")
    out.add_row("Register round trip p50 / p99", f"{r['register_rtt_p50_ms']:.1f} / {r['register_rtt_p99_ms']:.1f} ms",
                "", "")
    out.add_row("beats sent / answered (expected)",
                f"{r['beats_sent']:,} / {r['beats_answered']:,} ({r['beats_expected']:,})", "", "")
    errors = ", ".join(f"{k} {v}" for k, v in r["stream_errors"].items()) or "none"
    out.add_row("beats late (> 100 ms after their slot); stream errors", f"{r['beats_late']:,}; {errors}", "", "")
    out.add_row("heartbeat round trip p50", f"{r['rtt_p50_ms']:.1f} ms", "", "")
    out.add_row("heartbeat round trip p99", f"{r['rtt_p99_ms']:.1f} ms", f"< {RTT_P99_TARGET_MS:g} ms",
                met(r["rtt_p99_ms"] < RTT_P99_TARGET_MS))
    out.add_row("heartbeat round trip max", f"{r['rtt_max_ms']:.1f} ms", "", "")
    if r["load"] == "python":
        out.add_row("load generators' event-loop lag p99", f"{r['generator_loop_lag_p99_ms']:.1f} ms", "", "")
    out.add_row("nodes marked offline (head log; max polled; at end)",
                f"{r['offline_transitions']}; {r['offline_max_polled']}; {r['offline_at_end']}", "0",
                met(r["offline_transitions"] == r["offline_max_polled"] == r["offline_at_end"] == 0))
    out.add_row("head process CPU, % of one core (mean; p95 of 1 s); per beat",
                f"{r['head_cpu_pct_mean']:.1f} %; {r['head_cpu_pct_p95']:.1f} %; {r['head_cpu_us_per_beat']:.0f} µs",
                "(report)", "-")
    out.add_row("head process RSS (end; max)", f"{r['head_rss_mb_end']:.0f} MB; {r['head_rss_mb_max']:.0f} MB",
                "(report)", "-")
    out.add_row(f"head's Ray processes ({r['ray_processes']}): CPU mean; RSS",
                f"{r['ray_cpu_pct_mean']:.1f} %; {r['ray_rss_mb_end']:.0f} MB", "(report)", "-")
    load = "one C++ process" if r["load"] == "native" else f"{r['load_generators']} Python processes"
    out.add_row(f"heartbeat load ({load}, {r['agents_per_channel']} streams a channel): CPU; RSS max",
                f"{r['generators_cpu_pct_mean']:.1f} %; {r['generators_rss_mb_max']:.0f} MB", "(report)", "-")
    out.add_row("whole machine CPU, mean (of all cores); of it, other processes'",
                f"{r['machine_cpu_pct_mean']:.0f} %; {max(0.0, r['others_cpu_pct_mean']):.0f} %", "", "")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=5000)
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--interval-s", type=float, default=1.0, help="the head's heartbeat interval")
    parser.add_argument("--load", choices=("native", "python"), default="native",
                        help="who beats: one C++ process (the default: the least CPU taken from the head) or the "
                             "Python load generators that register the agents")
    parser.add_argument("--procs", type=int, default=2, help="load-generator (registering) processes")
    parser.add_argument("--agents-per-channel", type=int, default=100, help="heartbeat streams per gRPC channel")
    parser.add_argument("--register-concurrency", type=int, default=32, help="Register calls in flight per process")
    parser.add_argument("--register-timeout-s", type=float, default=300.0,
                        help="start the measured window after this long even if not every agent has registered")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    # The load generator's own arguments (the parent passes them).
    parser.add_argument("--generator", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--join-token", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--print-agents", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generator:
        uvloop.run(_generate(args))
        return
    console = Console(width=140)
    binary = None
    if args.load == "native":
        try:
            with console.status("building the native heartbeat load (once)..."):
                binary = native_load()
        except MissingTools as exc:
            print(f"control_plane.py: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    farms: list[LocalFarm] = []
    try:
        result = run(args, console, farms, binary)
    finally:
        with console.status("stopping the head..."):
            for farm in farms:
                farm.stop()
    console.print(table(result))
    console.print("CPU as % of one core from cpu_times deltas (user + system) over one-second samples; RSS in MiB. "
                  "The load generators share this machine's cores with the head. "
                  f"The head's log and the load's figures: {result['work']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        console.print(f"figures written to {args.json}")
    report_cleanup(console, farms)


if __name__ == "__main__":
    main()
