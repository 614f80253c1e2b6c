"""How the CLI prints: rich tables for people, JSON for scripts, one line on stderr for errors."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table

from farm.core.models import cpu_split
from farm.core.phases import ShardPhases, before_text, bound_by, summed, window_text
from farm.proto import convert
from farm.proto.v1 import fleet_pb2, job_pb2

console = Console()


def print_whole(table: RenderableType) -> None:
    """Print a table at its natural width, never elided to the console's (80 columns in a pipe): its names and figures
    are the point; a narrower terminal wraps the rows instead."""
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    width, console.width = console.width, max(console.width, natural)  # print(width=) only narrows
    try:
        console.print(table)
    finally:
        console.width = width


def show(table: RenderableType) -> None:
    """A table on a terminal fits its width (ids whole all the same: their columns never shrink, see `id_column`);
    into a pipe or a file, at its natural width: no screen to fit there, and what reads it wants every figure whole."""
    if console.is_terminal:
        console.print(table)
    else:
        print_whole(table)


ID_WIDTH = 10  # j-xxxxxxxx, n-xxxxxxxx (farm.core.ids)


def id_column(table: Table, header: str = "ID") -> None:
    """A column of ids: never wrapped, elided or shrunk below an id's width, whatever the console's."""
    table.add_column(header, no_wrap=True, min_width=ID_WIDTH)


def count(n: int) -> str:
    """A count of things (rows, items, shards): 200,000."""
    return f"{n:,}"


def figure(value: float) -> str:
    """A measured figure, in one format across the CLI: thousands separated and no exponent (151,439 · 39,540 ·
    12.5 · 0.9778)."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}" if abs(value) >= 1e-4 or value == 0 else f"{value:.2e}"


errors = Console(stderr=True)


def print_json(data: Any, indent: int | None = 2) -> None:
    sys.stdout.write(json.dumps(data, indent=indent) + "\n")
    sys.stdout.flush()


# A job's output reaches the user's terminal: its control characters (escape sequences that move the cursor, retitle
# the window, ...) are shown as U+FFFD, tabs and line ends kept.
CONTROLS = {c: "\ufffd" for c in (*range(0x00, 0x20), *range(0x7f, 0xa0)) if chr(c) not in "\t\n"}


def log_line_json(line: job_pb2.LogLine) -> dict[str, Any]:
    return {"id": line.id, "ts": line.ts, "level": line.level, "message": line.message,
            "shard": line.shard if line.HasField("shard") else None}


def print_log_line(line: job_pb2.LogLine) -> None:
    """`HH:MM:SS.mmm level   [shard N] message`; a message of several lines (a shard's output, a traceback) keeps
    them, indented under the first. Printed raw: rich would wrap long lines and read markup in a job's output."""
    stamp = datetime.fromtimestamp(line.ts).strftime("%H:%M:%S.%f")[:-3]
    first, *rest = line.message.translate(CONTROLS).splitlines() or [""]
    lead = f"{stamp} {line.level:<7} " + (f"[shard {line.shard}] " if line.HasField("shard") else "")
    indent = " " * len(lead)
    sys.stdout.write("".join([lead, first, "\n", *(f"{indent}{more}\n" for more in rest)]))
    sys.stdout.flush()


def fail(message: str, code: int) -> None:
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise SystemExit(code)


def ago(ts: float) -> str:
    if not ts:
        return "-"
    seconds = max(time.time() - ts, 0)
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


def node_json(node: fleet_pb2.Node) -> dict[str, Any]:
    return convert.to_dict(node)


def node_state(node: fleet_pb2.Node) -> str:
    """The node's state as `farm nodes` shows it: a drain the head has not applied yet already shows, and a
    draining node that runs nothing more is drained."""
    if node.state == "draining" or (node.state == "ready" and node.drain):
        return "draining" if node.shards_running else "drained"
    return node.state


def nodes_table(nodes: list[fleet_pb2.Node]) -> Table:
    table = Table(title="Nodes", title_justify="left")
    id_column(table)
    for column in ("NAME", "STATE", "BACKENDS", "CPU", "MEMORY", "POWER", "HEARTBEAT"):
        table.add_column(column)
    colours = {"ready": "green", "joining": "yellow", "draining": "yellow", "drained": "yellow", "offline": "red"}
    for node in nodes:
        backends = ", ".join(
            f"{b.name} ({b.device}, {b.detail or f'{b.threads} threads'})" if b.available
            else f"[dim]{b.name}: {b.reason}[/]"
            for b in node.backends
        )
        shown = node_state(node)
        state = f"[{colours.get(shown, 'white')}]{shown}[/]"
        if node.drain:
            state += "\n[yellow]drained by an operator[/]"
        if node.busy:  # its owner needs it: the scheduler gives it nothing now
            state += f"\n[yellow]busy: {node.busy}[/]"
        table.add_row(
            node.id, node.name, state, backends,
            cpu_text(node), f"{node.memory_percent:.0f}%",
            ", ".join(f"{p.device} {watts(p.watts, p.source)}" for p in node.power) or "-", ago(node.last_heartbeat),
        )
    return table


def cpu_text(node: fleet_pb2.Node) -> str:
    """The machine's CPU and Farm's part of it: a node at 78 % for its owner's work is not 78 % busy with Farm's."""
    _, farm = cpu_split(node)
    return f"{node.cpu_percent:.0f}% (farm {farm:.0f}%)"


# Estimates are shown as estimates: a counter's figure stands alone, the others say whose estimate they are.
SOURCE_MARK = {"counter": "", "vendor-estimate": " (vendor est.)", "model-estimate": " (model est.)"}


def watts(value: float, source: str) -> str:
    return f"{value:,.1f} W{SOURCE_MARK.get(source, f' ({source})')}"


def joules(value: float, source: str) -> str:
    if not source:
        return "-"
    return f"{value:,.3f} J{SOURCE_MARK.get(source, f' ({source})')}"


def marginal(record: job_pb2.Job | job_pb2.Shard, source: str) -> str:
    """The energy above idle of a shard or job, marked as its meter's figures are; "-" where unknown."""
    return joules(record.marginal_j, source) if record.HasField("marginal_j") else "-"


def job_json(job: job_pb2.Job) -> dict[str, Any]:
    data = convert.to_dict(job)
    data.pop("spec_yaml", None)
    data["items_done"] = items_done(job)
    return data


def items_done(job: job_pb2.Job) -> int:
    return sum(s.items for s in job.shards if s.state == "succeeded")


def jobs_table(jobs: list[job_pb2.Job]) -> Table:
    table = Table(title="Jobs", title_justify="left")
    id_column(table)
    for column in ("NAME", "KIND", "STATE", "PROGRESS", "ITEMS/S", "SUBMITTED"):
        table.add_column(column)
    for job in jobs:
        rate = job.metrics.get("items_per_s")
        table.add_row(
            job.id, job.name, job.kind, job.state, f"{count(items_done(job))}/{count(job.items)}",
            figure(rate) if rate else "-", ago(job.created_at),
        )
    return table


def shards_table(job: job_pb2.Job) -> Table:
    table = Table(title=f"Shards of {job.id}", title_justify="left")
    for column in ("#", "STATE", "NODE", "DEVICE", "ITEMS", "SECONDS", "ENERGY", "ABOVE IDLE", "MEMORY", "TRIES",
                   "ERROR"):
        table.add_column(column)
    for s in sorted(job.shards, key=lambda s: s.start):  # auto-sized shards are cut as the job runs: rows' order
        table.add_row(
            str(s.index), s.state, s.node_name or "-", s.device or s.backend or "-", count(s.stop - s.start),
            f"{s.seconds:.3f}" if s.seconds else "-", joules(s.energy_j, s.energy_source),
            marginal(s, s.energy_source),
            f"{s.peak_memory_bytes / 2**20:,.0f} MiB" if s.peak_memory_bytes else "-", str(s.attempts), s.error,
        )
    return table


def job_header(job: job_pb2.Job) -> str:
    lines = [f"[bold]{job.id}[/]  {job.name}  ({job.kind})  state: [bold]{job.state}[/]",
             f"items: {count(items_done(job))}/{count(job.items)}   output: {job.output}"]
    if job.energy_sources:
        above = f"; above idle {job.marginal_j:,.3f} J" if job.HasField("marginal_j") else ""
        lines.append(f"energy: {job.energy_j:,.3f} J ({', '.join(job.energy_sources)}){above}")
    if job.error:
        lines.append(f"[red]error: {job.error}[/]")
    return "\n".join(lines)


def summary_table(job: job_pb2.Job) -> Table:
    """Per node: what it ran and how fast."""
    per_node: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"shards": 0, "items": 0, "seconds": 0.0, "joules": 0.0, "marginal": 0.0, "known": True,
                 "backends": set(), "sources": set()}
    )
    for s in job.shards:
        if s.state != "succeeded":
            continue
        row = per_node[s.node_name]
        row["shards"] += 1
        row["items"] += s.items
        row["seconds"] += s.seconds
        row["joules"] += s.energy_j
        row["marginal"] += s.marginal_j
        row["known"] = row["known"] and s.HasField("marginal_j")
        row["backends"].add(s.backend)
        row["sources"].add(s.energy_source)
    table = Table(title=f"{job.name} ({job.id}): {job.state}", title_justify="left")
    for column in ("NODE", "BACKEND", "SHARDS", "ITEMS", "SECONDS", "ITEMS/S", "ENERGY", "ITEMS/J", "ABOVE IDLE",
                   "ITEMS/J ABOVE IDLE"):
        table.add_column(column, justify="right" if column not in ("NODE", "BACKEND") else "left")
    for name, row in sorted(per_node.items()):
        rate = row["items"] / row["seconds"] if row["seconds"] else 0.0
        source = next(iter(row["sources"])) if len(row["sources"]) == 1 else ""
        per_joule = figure(row["items"] / row["joules"]) if source and row["joules"] else "-"
        above = source if row["known"] else ""
        per_marginal = figure(row["items"] / row["marginal"]) if above and row["marginal"] else "-"
        table.add_row(name, ", ".join(sorted(row["backends"])), count(row["shards"]), count(row["items"]),
                      f"{row['seconds']:.3f}", figure(rate), joules(row["joules"], source), per_joule,
                      joules(row["marginal"], above), per_marginal)
    return table


READ_ROUTES = {"direct": "directly", "head": "through the head",
               "fallback": "through the head (it does not see the path as planned: its log says why)"}


def read_routes(job: job_pb2.Job) -> list[str]:
    """Per node, which way its shards' data came, as the node reported it (shards counted per way)."""
    by_node: dict[str, Counter[str]] = defaultdict(Counter)
    for s in job.shards:
        if s.node_name and s.read_route in READ_ROUTES:
            by_node[s.node_name][s.read_route] += 1
    return [f"{node}: " + ", ".join(f"{n} shard{'s' if n != 1 else ''} read {READ_ROUTES[way]}"
                                    for way, n in sorted(ways.items())) for node, ways in sorted(by_node.items())]


def sizes_by_device(job: job_pb2.Job) -> list[str]:
    """Per device, the sizes of the shards it was given, in the order they were cut (runs of one size counted)."""
    by_device: dict[str, list[int]] = defaultdict(list)
    for s in sorted(job.shards, key=lambda s: s.index):
        if s.node_name:
            by_device[f"{s.node_name}/{s.device or s.backend}"].append(s.stop - s.start)
    lines = []
    for device, sizes in sorted(by_device.items()):
        runs: list[list[int]] = []
        for size in sizes:
            if runs and runs[-1][0] == size:
                runs[-1][1] += 1
            else:
                runs.append([size, 1])
        lines.append(f"{device}: " + ", ".join(f"{size:,}" + (f" x{n}" if n > 1 else "") for size, n in runs))
    return lines


def time_by_device(job: job_pb2.Job) -> list[str]:
    """Per device, where its shards' time went on their node (farm.core.phases): their measured windows' parts, which
    of them bound it, what came before the windows, and what of the device's span (its first placement to its last
    result) was in neither: dispatch, the worker's turn between shards, results (where a device runs one shard at a
    time: shards side by side on a device of several slots overlap, and leave less)."""
    by_device: dict[str, list[job_pb2.Shard]] = defaultdict(list)
    for s in job.shards:
        if s.node_name and s.HasField("time"):
            by_device[f"{s.node_name}/{s.device or s.backend}"].append(s)
    lines = []
    for device, shards in sorted(by_device.items()):
        phases, window = summed((ShardPhases.of_seconds({f.name: v for f, v in s.time.ListFields()}, s.seconds)
                                 or ShardPhases(), s.seconds) for s in shards)
        line = (f"{device}: {count(len(shards))} shard{'s' if len(shards) != 1 else ''}, {window:.3f} s measured: "
                f"{window_text(phases, window)} (bound by {bound_by(phases, window)}); before them "
                f"{phases.before:.2f} s: {before_text(phases)}")
        placed, ended = [s.placed_at for s in shards if s.placed_at], [s.finished_at for s in shards if s.finished_at]
        if placed and ended and max(ended) > min(placed):
            span = max(ended) - min(placed)
            line += (f"; of its span of {span:.2f} s (first placement to last result), "
                     f"{max(span - window - phases.before, 0.0):.2f} s in neither (dispatch, between shards, results)")
        lines.append(line)
    return lines
