"""`farm nodes`, `farm drain NODE`, `farm undrain NODE`."""

from __future__ import annotations

from typing import Annotated

import typer

from farm.cli.options import Head, Json, Token, connect
from farm.cli.render import console, node_json, node_state, nodes_table, print_json

NodeRef = Annotated[str, typer.Argument(help="The node's id or name.", show_default=False)]


def nodes(json: Json = False, head: Head = None, token: Token = None) -> None:
    """List the fleet's nodes, their state and their backends."""
    with connect(head, token) as client:
        found = client.nodes()
    print_json([node_json(n) for n in found]) if json else console.print(nodes_table(found))


def drain(node: NodeRef, json: Json = False, head: Head = None, token: Token = None) -> None:
    """Give a node no new shards; what runs there finishes. It stays drained across restarts until `farm undrain`."""
    _set_drain(node, True, json, head, token)


def undrain(node: NodeRef, json: Json = False, head: Head = None, token: Token = None) -> None:
    """Let a drained node take shards again."""
    _set_drain(node, False, json, head, token)


def _set_drain(node: str, drain: bool, json: bool, head: str | None, token: str | None) -> None:
    with connect(head, token) as client:
        found = client.drain_node(node, drain)
    if json:
        print_json(node_json(found))
    else:
        running = f", {found.shards_running} shards still running there" if drain and found.shards_running else ""
        console.print(f"node {found.name} ({found.id}) {'drained' if drain else 'undrained'}: "
                      f"{node_state(found)}{running}", highlight=False)
