"""Options shared by several commands."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from farm.cli.render import errors
from farm.client import Client, find_head
from farm.client.config import read_secret_file
from farm.core.errors import UserError
from farm.local import default_state_dir, python_command, spawn_detached, terminate, wait_for

Json = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
Head = Annotated[str | None, typer.Option("--head", help="HOST:PORT of the head; default: the local head.")]
Token = Annotated[str | None, typer.Option(
    "--token", help="API token for --head (shows in `ps`: prefer --token-file or FARM_TOKEN).", show_default=False)]
TokenFile = Annotated[Path | None, typer.Option(
    "--token-file", help="A file holding the API token (or FARM_TOKEN_FILE).", show_default=False)]
Ca = Annotated[Path | None, typer.Option(
    "--ca", help="The head's CA certificate, its tls/ca.pem (or FARM_CA; default: the profile's, else the system's "
                 "roots).", show_default=False)]
StateDir = Annotated[
    Path | None, typer.Option("--state-dir", help="Farm's state directory (default: $FARM_STATE_DIR or ~/.farm).")
]


def start_in_background(argv: list[str], log: Path, ready: Callable[[], bool], what: str) -> subprocess.Popen[bytes]:
    """Re-run this `farm` command without --detach in its own session; return once `ready()` holds. If the process
    dies or never gets ready, stop it and say why: its log's last `error:` line (what came after, a library's noise as
    the process ended, would hide it), else the log's last line."""
    proc = spawn_detached(python_command("farm.cli.main", *[a for a in argv if a != "--detach"]), log)
    wait_for(lambda: proc.poll() is not None or ready(), timeout=120)
    if proc.poll() is not None or not ready():
        if proc.poll() is None:
            terminate(proc.pid)
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        said = [line for line in lines if line.startswith("error: ")][-1:] or lines[-1:]
        raise UserError(f"{what}: {said[0] if said else 'no output'} (log: {log})")
    return proc


def state_dir(value: Path | None) -> Path:
    return (value or default_state_dir()).expanduser().resolve()


class Selected:
    """What the root command was told before the command (`farm --profile NAME ...`); set once per invocation."""

    profile: str | None = None


def connect(head: str | None, token: str | None, ca: Path | None = None, token_file: Path | None = None) -> Client:
    """A client of the head these options (and the profile, the environment, the local state folder) name."""
    if token is not None and token_file is not None:
        raise UserError("give the API token with one of --token and --token-file, not both")
    if token_file is not None:
        token = read_secret_file(token_file, "--token-file")
    found = find_head(head, token, ca=ca, profile=Selected.profile)
    if token is not None and token_file is None:  # once the input checked out, as `farm agent start` warns
        errors.print("warning: --token shows in `ps` to every user of this machine; give it with FARM_TOKEN=... or "
                     "--token-file", style="yellow", highlight=False, soft_wrap=True)
    return Client(found)


def reattach_prefix(client: Client) -> tuple[str, str]:
    """What to put before and after a command so that it reaches this client's head again: `farm --profile P`, or
    `farm` and ` --head HOST:PORT` (the token comes from where it came from this time)."""
    if client.head.profile:
        return f"farm --profile {client.head.profile}", ""
    if client.head.pid:  # the local head
        return "farm", ""
    return "farm", f" --head {client.head.address}"


def count(text: str, option: str, least: int = 1, most: int = 1_000_000_000) -> int:
    """A whole number from `least` to `most` (taken as text, so that a bad one is one line, not click's box)."""
    try:
        number = int(text)
    except ValueError:
        raise UserError(f"{option} {text!r}: expected a whole number") from None
    if number < least:
        raise UserError(f"{option} {text!r}: must be at least {least}")
    if number > most:
        raise UserError(f"{option} {text!r}: must be at most {most}")
    return number


def duration(text: str, option: str) -> float:
    """Seconds in `text`: a number and a unit (s, m, h, d), as 30m or 7d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = text[:-1], text[-1:].lower()
    try:
        seconds = float(number) * units[unit]
    except (KeyError, ValueError):
        raise UserError(f"{option} {text!r}: expected a number and a unit (s, m, h, d), as 30m or 2h") from None
    if not 0 < seconds < 1e11:
        raise UserError(f"{option} {text!r}: must be positive")
    return seconds
