"""The `farm` entry point: composes the command modules and turns every FarmError into one line and an exit code."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

import farm
from farm.cli import agent, ane, demo, head, jobs, kernels, nodes, profiles, results, top
from farm.cli.options import Selected
from farm.cli.render import fail
from farm.core.errors import FarmError

app = typer.Typer(
    help="Farm: idle Macs and NVIDIA boxes as one compute farm.", no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(head.app, name="head")
app.add_typer(agent.app, name="agent")
app.add_typer(kernels.app, name="kernels")
app.add_typer(ane.app, name="ane")
app.add_typer(profiles.app, name="profile")
app.command("nodes")(nodes.nodes)
app.command("drain")(nodes.drain)
app.command("undrain")(nodes.undrain)
jobs.register(app)
app.command("demo")(demo.demo)
app.command("top")(top.top)
app.command("results")(results.results)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"farm {farm.__version__}\n")
        raise typer.Exit()


@app.callback()
def root(
    profile: Annotated[
        str | None, typer.Option("--profile", "-p", help="The head to use, by its profile's name (farm profile "
                                 "list); `local`: the head of the local state folder.",
                                 autocompletion=profiles.profile_names)
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", help="Print Farm's version.", callback=_version, is_eager=True)
    ] = False,
) -> None:
    Selected.profile = profile


def main() -> None:
    try:
        app(prog_name="farm")
    except FarmError as exc:
        fail(exc.message, exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
