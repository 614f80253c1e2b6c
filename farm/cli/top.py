"""`farm top`: the fleet and its jobs, live in the terminal (the same figures as the web dashboard, over gRPC)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from farm.cli.options import Ca, Head, Token, TokenFile, connect
from farm.cli.render import ago, console, figure, id_column, items_done, job_json, node_json, print_json, show
from farm.core.models import cpu_split
from farm.client import Client
from farm.proto.v1 import common_pb2, fleet_pb2, job_pb2

JOBS_SHOWN = 10
JOBS_READ = 50  # the latest jobs, whose running shards count against their nodes
EST = " est."  # beside any figure that no hardware counter measured
STATE_COLOURS = {"ready": "green", "joining": "yellow", "draining": "yellow", "offline": "red", "queued": "yellow",
                 "running": "cyan", "succeeded": "green", "failed": "red", "cancelled": "red"}


def top(
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.", min=0.2)] = 1.0,
    json: Annotated[bool, typer.Option("--json", help="Print one frame as JSON (the nodes, the latest jobs) and exit."
                                       )] = False,
    head: Head = None,
    token: Token = None,
    ca: Ca = None,
    token_file: TokenFile = None,
) -> None:
    """A live view of the fleet: nodes, their load and power, and the latest jobs (Ctrl-C to leave)."""
    with connect(head, token, ca, token_file) as client:
        if json:
            print_json(frame_json(client))
            return
        if once:
            show(frame(client))
            return
        with Live(frame(client), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(frame(client), refresh=True)


def frame(client: Client) -> Group:
    nodes = client.nodes()
    jobs = client.list_jobs(limit=JOBS_READ)
    running = Counter(s.node_id for j in jobs for s in j.shards if s.state == "running")
    return Group(fleet_line(nodes, running), Text(), nodes_table(nodes, running), Text(),
                 jobs_table(jobs[:JOBS_SHOWN]))


def frame_json(client: Client) -> dict[str, Any]:
    """What a frame shows, for scripts: the nodes as `farm nodes --json` gives them, the latest jobs as `farm jobs
    --json` does."""
    return {"time": time.time(), "nodes": [node_json(n) for n in client.nodes()],
            "jobs": [job_json(j) for j in client.list_jobs(limit=JOBS_SHOWN)]}


def fleet_line(nodes: list[fleet_pb2.Node], running: Counter[str]) -> Text:
    states = Counter(n.state for n in nodes)
    readings = [p for n in nodes if n.state != "offline" for p in n.power]
    return Text.assemble(
        ("Farm  ", "bold"), f"{len(nodes)} nodes (",
        ", ".join(f"{count} {state}" for state, count in sorted(states.items())) or "none", ")   ",
        f"power {power(readings)}   shards running {sum(running.values())}   ", (time.strftime("%H:%M:%S"), "dim"),
    )


def nodes_table(nodes: list[fleet_pb2.Node], running: Counter[str]) -> Table:
    table = Table(title="Nodes", title_justify="left", box=None, pad_edge=False, header_style="bold underline")
    for column in ("NAME", "STATE", "BACKENDS", "CPU", "FARM", "MEM", "POWER", "SHARDS", "BEAT"):
        table.add_column(column, no_wrap=True, overflow="ellipsis",
                         justify="right" if column in ("FARM", "MEM", "POWER", "SHARDS", "BEAT") else "left")
    for node in nodes:
        state = Text(node.state, style=STATE_COLOURS.get(node.state, ""))
        if node.state != "offline":
            activity = f"busy: {node.busy}" if node.busy else "working" if running[node.id] else "idle"
            state.append(f" {activity}", style="yellow" if node.busy else "dim")
        devices = Counter(b.name for b in node.backends if b.available)
        backends = ", ".join(f"{name}×{count}" if count > 1 else name for name, count in devices.items()) or "-"
        table.add_row(
            node.name, state, backends, meter(node.cpu_percent, width=5), f"{cpu_split(node)[1]:.0f}%",
            f"{node.memory_percent:.0f}%",
            power(node.power), str(running[node.id]), ago(node.last_heartbeat).removesuffix(" ago"),
        )
    return table


def jobs_table(jobs: list[job_pb2.Job]) -> Table:
    table = Table(title=f"Jobs (latest {JOBS_SHOWN})", title_justify="left", box=None, pad_edge=False,
                  header_style="bold underline")
    id_column(table)  # whole, never elided: the id is what `farm job` takes
    for column in ("NAME", "STATE", "PROGRESS", "SHARDS", "ENERGY", "ITEMS/J"):
        table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=24 if column == "NAME" else None,
                         justify="left" if column in ("NAME", "STATE", "PROGRESS") else "right")
    for job in jobs:
        done = items_done(job)
        shards_done = sum(1 for s in job.shards if s.state == "succeeded")
        estimate = any(source != "counter" for source in job.energy_sources)
        per_joule = job.metrics.get("items_per_j")
        table.add_row(
            job.id, job.name, Text(job.state, style=STATE_COLOURS.get(job.state, "")),
            meter(100 * done / job.items if job.items else 0.0, width=5),
            f"{shards_done}/{len(job.shards)}",
            f"{job.energy_j:,.1f} J{EST if estimate else ''}" if job.energy_sources else "-",
            f"{figure(per_joule)}{EST if estimate else ''}" if per_joule else "-",
        )
    return table


def power(readings: Sequence[common_pb2.DevicePower]) -> str:
    """A node's power, all its devices together, marked as an estimate where any reading is one."""
    if not readings:
        return "-"
    estimate = any(p.source != "counter" for p in readings)
    return f"{sum(p.watts for p in readings):,.1f} W{EST if estimate else ''}"


def meter(percent: float, width: int) -> Text:
    """A bar of `width` cells and the percentage."""
    filled = round(max(0.0, min(percent, 100.0)) / 100 * width)
    return Text("█" * filled, style="cyan") + Text("·" * (width - filled), style="dim") + Text(f" {percent:3.0f}%")
