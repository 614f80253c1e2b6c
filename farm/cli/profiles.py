"""`farm profile add | list | use | remove`: the heads this machine talks to (farm.client.config)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from farm.cli.options import Json
from farm.cli.render import console, print_json, show
from farm.client.config import FarmConfig, Profile, config_path, remove_profile, save_profile, set_default
from farm.core.errors import UserError

app = typer.Typer(help="Named heads (a TOML file: FARM_CONFIG, default ~/.config/farm/config.toml).",
                  no_args_is_help=True)


def profile_names(incomplete: str) -> list[str]:
    """Shell completion of profile names."""
    try:
        names = [*FarmConfig.load().profiles, "local"]
    except UserError:
        return []
    return [name for name in names if name.startswith(incomplete)]


Name = Annotated[str, typer.Argument(help="The profile's name.", autocompletion=profile_names)]


@app.command()
def add(
    name: Annotated[str, typer.Argument(help="A name for the head: letters, digits, '.', '_', '-'.")],
    head: Annotated[str, typer.Option("--head", help="HOST:PORT of the head's gRPC port.")],
    token_file: Annotated[
        Path | None, typer.Option("--token-file", help="A file holding the head's API token (its head.json's "
                                  "api_token); read at each use, never copied.")
    ] = None,
    ca_file: Annotated[
        Path | None, typer.Option("--ca-file", help="The head's CA certificate (its tls/ca.pem).")
    ] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="The head runs without TLS.")] = False,
    default: Annotated[bool, typer.Option("--default", help="Use it when no --profile or --head says otherwise.")
                       ] = False,
) -> None:
    """Add a head (or replace the profile of that name)."""
    for path, what in ((token_file, "token file"), (ca_file, "CA file")):
        if path is not None and not path.expanduser().is_file():
            raise UserError(f"{what} {path}: no such file")
    try:
        profile = Profile(address=head, token_file=token_file and token_file.expanduser().resolve(),
                          ca_file=ca_file and ca_file.expanduser().resolve(), insecure=insecure)
    except ValueError as exc:
        raise UserError(f"--head: {head!r} is not HOST:PORT") from exc
    path = save_profile(name, profile, make_default=default)
    console.print(f"profile {name} → {head} (in {path})", highlight=False)


@app.command("list")
def list_profiles(json: Json = False) -> None:
    """The profiles, the default marked."""
    config = FarmConfig.load()
    rows = [{"name": n, "default": n == config.profile, **p.model_dump(mode="json")}
            for n, p in sorted(config.profiles.items())]
    if json:
        print_json(rows)
        return
    table = Table(title=f"Profiles ({config_path()})", title_justify="left")
    for column in ("NAME", "HEAD", "TOKEN FILE", "CA FILE"):
        table.add_column(column)
    for row in rows:
        name = f"{row['name']} [bold](default)[/]" if row["default"] else row["name"]
        ca = "none (no TLS)" if row["insecure"] else row["ca_file"] or "system roots"
        table.add_row(name, row["address"], row["token_file"] or "-", ca)
    show(table)


@app.command()
def use(name: Name) -> None:
    """Make a profile the default."""
    set_default(name)
    console.print(f"default profile: {name}", highlight=False)


@app.command()
def remove(name: Name) -> None:
    """Remove a profile."""
    remove_profile(name)
    console.print(f"removed profile {name}", highlight=False)
