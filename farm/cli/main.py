"""The `farm` entry point: composes the command modules and turns every FarmError into one line and an exit code."""

from __future__ import annotations

import os
import sys

# gRPC's C++ core logs a failed TLS handshake on stderr beside the one line Farm prints about it (farm.client.api):
# a command line is quiet, unless the user asks (GRPC_VERBOSITY). Read when grpc is imported: before the imports below.
# The long-running servers (`farm head start`, `farm agent start`) keep gRPC's default.
if sys.argv[1:3] not in (["head", "start"], ["agent", "start"]):
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import inspect  # noqa: E402
from typing import Annotated, Any  # noqa: E402

import typer  # noqa: E402
from typer.core import TyperCommand, TyperGroup, TyperOption  # noqa: E402

import farm  # noqa: E402
from farm.cli import agent, ane, demo, head, jobs, kernels, nodes, profiles, results, top  # noqa: E402
from farm.cli.options import Selected  # noqa: E402
from farm.cli.render import fail  # noqa: E402
from farm.core.errors import FarmError  # noqa: E402

def tidy_help(command: TyperCommand | TyperGroup) -> None:
    """Help as people read it, for this command and those under it: a docstring's paragraphs flow as paragraphs
    (typer's rich help keeps a docstring's line ends, which cut sentences in the middle), and a flag shows no
    `<bool>` placeholder (it takes no value). Idempotent."""
    for attribute in ("help", "short_help"):
        text = getattr(command, attribute)
        if text:
            paragraphs = inspect.cleandoc(text).split("\n\n")
            setattr(command, attribute, "\n\n".join(" ".join(p.split()) for p in paragraphs))
    help_option = command.get_help_option(typer.Context(command))  # made once, cached by the command
    for param in [*command.params, help_option]:
        if isinstance(param, TyperOption) and param.is_flag:
            param.metavar = ""
    for sub in command.commands.values() if isinstance(command, TyperGroup) else ():
        tidy_help(sub)  # type: ignore[arg-type]  # typer builds only its own command classes


class TidyGroup(TyperGroup):
    """The `farm` group: typer builds every command under it first, so its help is tidied here for all of them
    (`tidy_help`); again when shown, for the options typer adds after (--install-completion, ...)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        tidy_help(self)

    def format_help(self, ctx: Any, formatter: Any) -> None:  # click's Context, as typer vendors it
        tidy_help(self)
        super().format_help(ctx, formatter)


app = typer.Typer(
    help="Farm: idle Macs and NVIDIA boxes as one compute farm.", no_args_is_help=True,
    pretty_exceptions_enable=False, cls=TidyGroup,
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
