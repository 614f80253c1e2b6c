"""`farm head start|stop`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from farm.cli.options import StateDir, start_in_background, state_dir
from farm.cli.render import console
from farm.core.errors import UserError
from farm.local import pid_alive, primary_ip, read_json, terminate, write_json

if TYPE_CHECKING:
    from farm.head.settings import HeadSettings

app = typer.Typer(help="Run the head: the control plane, the scheduler and the Ray head.", no_args_is_help=True)


@app.command()
def start(
    port: Annotated[int, typer.Option(help="gRPC port agents and the CLI connect to.")] = 7700,
    ray_port: Annotated[int | None, typer.Option(help="Ray's GCS port (default: --port + 1).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    advertise: Annotated[
        str | None, typer.Option(help="Address agents reach this head at (default: this machine's first IPv4).")
    ] = None,
    state: StateDir = None,
    detach: Annotated[bool, typer.Option("--detach", help="Run in the background and return once ready.")] = False,
    dashboard_port: Annotated[
        int | None, typer.Option(help="The web dashboard's and /metrics' port (default: --port + 2, else a free one).")
    ] = None,
    secrets_dir: Annotated[Path | None, typer.Option(
        help="Take the join and API tokens from the files join-token and api-token in this folder (a mounted "
             "Kubernetes Secret) rather than from the state folder, where they are generated on first start.")] = None,
) -> None:
    """Start a head; prints the command that joins other machines to it."""
    from farm.dashboard import Dashboard, pick_port
    from farm.head.server import serve
    from farm.head.settings import HeadSettings

    loopback = host.startswith("127.") or host == "localhost"
    settings = HeadSettings(
        state_dir=state_dir(state), host=host, port=port, ray_port=ray_port or port + 1,
        advertise=advertise or ("127.0.0.1" if loopback else primary_ip()),
    )
    if detach:
        _start_detached(settings.state_dir, sys.argv[1:])
        return
    if secrets_dir is not None:
        _adopt_secrets(secrets_dir, settings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The head's process serves the dashboard too, composed here: the head never imports it.
    dashboard = Dashboard(host, pick_port(host, dashboard_port, default=port + 2), settings.advertise)
    serve(settings, on_ready=lambda join: console.print(
        f"head ready; dashboard at {dashboard.url}\njoin other machines with:\n  {join}", highlight=False,
    ), services=[dashboard])


def _adopt_secrets(folder: Path, settings: HeadSettings) -> None:
    """Write the given tokens where the head reads them (secrets.json in its state folder), so that a Secret, not the
    volume, decides them: rotated in the Secret, they take effect at the next start."""
    from farm.head.server import check_can_start

    tokens = {}
    for key in ("join-token", "api-token"):
        try:
            tokens[key.replace("-", "_")] = (folder / key).read_text().strip()
        except OSError as exc:
            raise UserError(f"--secrets-dir: cannot read {folder / key}: {exc.strerror}") from None
        if not tokens[key.replace("-", "_")]:
            raise UserError(f"--secrets-dir: {folder / key} is empty")
    check_can_start(settings)  # never swap the tokens under a head that runs from this state folder
    write_json(settings.state_dir / "secrets.json", tokens)


def _start_detached(directory: Path, argv: list[str]) -> None:
    info = read_json(directory / "head.json")
    if info and pid_alive(int(info.get("pid", 0))):
        raise UserError(f"a head is already running from {directory} (pid {info['pid']})")
    (directory / "head.json").unlink(missing_ok=True)  # a stale one, from a head that did not stop cleanly
    log = directory / "head.log"
    proc = start_in_background(argv, log, lambda: read_json(directory / "head.json") is not None,
                               "the head did not start")
    info = read_json(directory / "head.json") or {}
    console.print(f"head running (pid {proc.pid}), state in {directory}, log in {log}")
    console.print(f"dashboard at {info.get('dashboard', '-')}", highlight=False)
    console.print("join other machines with:")
    console.print(f"  farm agent start --head {info['address']} --token {info['join_token']}", highlight=False)


@app.command()
def stop(state: StateDir = None) -> None:
    """Stop the local head (and its Ray head)."""
    directory = state_dir(state)
    info = read_json(directory / "head.json")
    if info is None or not pid_alive(int(info.get("pid", 0))):
        raise UserError(f"no head running from {directory}")
    terminate(int(info["pid"]))
    console.print(f"head {info['pid']} stopped")
