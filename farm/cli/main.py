"""The `farm` entry point: composes the command modules and turns every FarmError into one line and an exit code."""

from __future__ import annotations

import sys

import typer

from farm.cli import agent, ane, demo, head, jobs, kernels, nodes, results, top
from farm.cli.render import fail
from farm.core.errors import FarmError

app = typer.Typer(
    help="Farm: idle Macs and NVIDIA boxes as one compute farm.", no_args_is_help=True,
    pretty_exceptions_enable=False, add_completion=False,
)
app.add_typer(head.app, name="head")
app.add_typer(agent.app, name="agent")
app.add_typer(kernels.app, name="kernels")
app.add_typer(ane.app, name="ane")
app.command("nodes")(nodes.nodes)
app.command("drain")(nodes.drain)
app.command("undrain")(nodes.undrain)
jobs.register(app)
app.command("demo")(demo.demo)
app.command("top")(top.top)
app.command("results")(results.results)


def main() -> None:
    try:
        app()
    except FarmError as exc:
        fail(exc.message, exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
