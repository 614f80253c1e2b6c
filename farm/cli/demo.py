"""`farm demo`: a local head, two agents and the digits job, end to end; leaves nothing running (unless --keep)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

import farm
from farm import ray_user
from farm.cli.jobs import follow, show_summary
from farm.cli.render import console
from farm.client import Client, find_head
from farm.client.preflight import prepare
from farm.core.errors import FarmError, UserError
from farm.local import free_ports, read_json, recorded_alive, terminate, write_private

SPEC = Path("examples/digits/infer.yaml")
ACCURACY_BAR = 0.90


def demo(
    agents: Annotated[int, typer.Option(help="Local agents to start.", min=1, max=8)] = 2,
    keep: Annotated[bool, typer.Option("--keep", help="Leave the head, its dashboard and the agents running.")] = False,
) -> None:
    """Start a local head and agents, run the digits inference job across them, print a summary, stop it all."""
    root = Path(farm.__file__).resolve().parents[1]
    if not (root / SPEC).is_file():
        raise UserError(f"farm demo needs a source checkout of Farm: {root / SPEC} is missing")
    state = Path(tempfile.mkdtemp(prefix="farm-demo-"))
    began = time.monotonic()
    ok = False
    try:
        port, ray_port = free_ports(2)
        ray_as = _ray_user()
        with console.status("starting a local head..."):
            # Its dashboard over plain HTTP: on loopback only, a browser opens it without a certificate warning.
            _farm("head", "start", "--host", "127.0.0.1", "--port", str(port), "--ray-port", str(ray_port),
                  "--state-dir", str(state), "--detach", *ray_as, "--dashboard-http")
        head = find_head(state_dir=state)
        dashboard = (read_json(state / "head.json") or {}).get("dashboard")
        if dashboard:
            console.print(f"dashboard: {dashboard}  (watch the fleet and the job live; sign in with api_token from "
                          f"{state / 'head.json'})", highlight=False, soft_wrap=True)
        cpus = max(1, (os.cpu_count() or 1) // agents)
        token_file = state / "join.token"  # 0600: on the agents' command lines the token would show in `ps`
        write_private(token_file, head.join_token.encode())
        with console.status(f"starting {agents} agents ({cpus} cores each)..."):
            _farm_all([
                ["agent", "start", "--head", head.address, "--token-file", str(token_file), "--ca-hash", head.ca_hash,
                 "--name", f"demo-{index}",
                 "--cpus", str(cpus), "--state-dir", str(state), "--detach", *ray_as,
                 "--max-foreign-cpu", "100"]  # the agents share this host: each would see the other as its owner
                for index in range(1, agents + 1)
            ])
        with Client(head) as client:
            prepared = prepare(root / SPEC, root)
            job_id = client.submit_prepared(prepared, overwrite=True)  # the last demo's results: the same job
            job = follow(client, job_id)
        show_summary(job)
        nodes_used = {s.node_name for s in job.shards if s.state == "succeeded" and s.node_name}
        accuracy = job.metrics.get("accuracy", 0.0)
        ok = job.state == "succeeded" and accuracy >= ACCURACY_BAR
        verdict = "[green]passed[/]" if ok else "[red]failed[/]"
        console.print(
            f"demo {verdict}: {len(nodes_used)} of {agents} agents ran shards; accuracy {accuracy:.2%} "
            f"(bar: {ACCURACY_BAR:.0%})"
        )
    finally:
        if keep and ok:
            console.print(f"the head and agents keep running (state in {state}); stop them with\n"
                          f"  farm agent stop --state-dir {state} && farm head stop --state-dir {state}")
        else:
            with console.status("stopping agents and head..."):
                _stop_all(state)
            if ok:
                shutil.rmtree(state, ignore_errors=True)
            else:
                console.print(f"state, logs and store kept in {state}")
    if keep and ok:
        return
    console.print(f"done in {time.monotonic() - began:.1f} s; nothing left running")
    if not ok:
        raise typer.Exit(1)


def _farm(*args: str) -> None:
    _farm_all([list(args)])


def _farm_all(commands: list[list[str]]) -> None:
    """Run `farm` commands side by side; the first failure is reported."""
    procs = [
        (args, subprocess.Popen([sys.executable, "-m", "farm.cli.main", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True))
        for args in commands
    ]
    for args, proc in procs:
        _, stderr = proc.communicate()
        if proc.returncode != 0:
            message = (stderr.strip().splitlines() or ["no output"])[-1].removeprefix("error: ")
            raise FarmError(f"`farm {' '.join(args[:2])}` failed: {message}")


def _stop_all(state: Path) -> None:
    """Agents first (together), so that they deregister from a head that still listens; then the head."""
    agents = [read_json(path) or {} for path in (state / "agents").glob("*/agent.json")]
    terminate(*[int(status["pid"]) for status in agents if recorded_alive(status)])
    info = read_json(state / "head.json") or {}
    if recorded_alive(info):
        terminate(int(info["pid"]))


def _ray_user() -> list[str]:
    """The demo's --ray-user: none where job code may run as farm-ray, as on every farm (root, once scripts/setup let
    farm-ray reach this Python and checkout; any other user runs it as itself); else, said in one line, the invoking
    root: a throw-away farm on loopback whose only nodes are this user's own agents, which no lender joins."""
    name = ray_user.chosen(None)
    if name is None:
        return []
    import farm_agent

    if ray_user.first_closed(ray_user.ensure(name), [Path(farm.__file__).parent, Path(farm_agent.__file__).parent]):
        me = pwd.getpwuid(os.geteuid()).pw_name
        console.print(f"job code runs as {me} in this demo: {name} cannot reach this Python or checkout (run "
                      "./scripts/setup as root to let it)", highlight=False, soft_wrap=True)
        return ["--ray-user", me]
    return []
