"""Options shared by several commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from farm.client import Client, find_head
from farm.local import default_state_dir

Json = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
Head = Annotated[str | None, typer.Option("--head", help="HOST:PORT of the head; default: the local head.")]
Token = Annotated[str | None, typer.Option("--token", help="API token for --head (or FARM_TOKEN).", show_default=False)]
StateDir = Annotated[
    Path | None, typer.Option("--state-dir", help="Farm's state directory (default: $FARM_STATE_DIR or ~/.farm).")
]


def state_dir(value: Path | None) -> Path:
    return (value or default_state_dir()).expanduser().resolve()


def connect(head: str | None, token: str | None) -> Client:
    return Client(find_head(head, token))
