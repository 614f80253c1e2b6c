"""`farm agent start|stop`."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from farm.cli.options import StateDir, start_in_background, state_dir
from farm.cli.render import console
from farm.core.errors import UserError
from farm.local import pid_alive, read_json, terminate

app = typer.Typer(help="Run a node agent that offers this machine to a head.", no_args_is_help=True)


def agent_dir(state: Path, name: str) -> Path:
    return state / "agents" / name


@app.command()
def start(
    head: Annotated[str, typer.Option(help="HOST:PORT of the head.")],
    token: Annotated[str, typer.Option(help="The join token `farm head start` printed.")],
    name: Annotated[str | None, typer.Option(help="Node name (default: the host name).")] = None,
    cpus: Annotated[int | None, typer.Option(help="CPU cores to offer (default: all).", min=1)] = None,
    max_foreign_cpu: Annotated[float, typer.Option(
        help="Take no new shards while the owner's processes use more than this share of the CPU (percent; "
             "100 turns the rule off, as for several agents on one host).", min=1, max=100)] = 90.0,
    state: StateDir = None,
    detach: Annotated[bool, typer.Option("--detach", help="Run in the background; return once the node is ready.")] = False,
) -> None:
    """Register this machine with a head and run shards for it."""
    from farm_agent.main import serve
    from farm_agent.settings import AgentSettings

    name = name or socket.gethostname()
    if ":" not in head:
        raise UserError(f"--head {head!r}: expected HOST:PORT")
    settings = AgentSettings(
        head=head, token=token, name=name, state_dir=agent_dir(state_dir(state), name), cpus=cpus or os.cpu_count() or 1,
        max_foreign_cpu=max_foreign_cpu,
    )
    status = read_json(settings.status_path)
    if status and pid_alive(int(status.get("pid", 0))):
        raise UserError(f"agent {name!r} is already running (pid {status['pid']})")
    if detach:
        _start_detached(settings.state_dir, settings.status_path, sys.argv[1:], name)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(settings)


def _start_detached(directory: Path, status_path: Path, argv: list[str], name: str) -> None:
    status_path.unlink(missing_ok=True)
    log = directory / "agent.log"
    proc = start_in_background(argv, log, lambda: (read_json(status_path) or {}).get("state") == "ready",
                               f"agent {name!r} did not become ready")
    status = read_json(status_path) or {}
    console.print(f"agent {name} running (pid {proc.pid}) as node {status.get('node_id')}; log in {log}")


@app.command()
def stop(
    name: Annotated[str | None, typer.Option(help="Stop only this agent (default: every local agent).")] = None,
    state: StateDir = None,
) -> None:
    """Stop local agents: their shards are rescheduled elsewhere, their Ray nodes stop."""
    root = state_dir(state) / "agents"
    paths = [agent_dir(state_dir(state), name) / "agent.json"] if name else sorted(root.glob("*/agent.json"))
    running = [(p, s) for p in paths if (s := read_json(p)) and pid_alive(int(s.get("pid", 0)))]
    if not running:
        raise UserError(f"no agent{' ' + repr(name) if name else ''} running from {root}")
    terminate(*[int(status["pid"]) for _, status in running])
    for _, status in running:
        console.print(f"agent {status['name']} (pid {status['pid']}) stopped")
