"""`farm nodes`, `farm drain NODE`, `farm undrain NODE`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from farm.cli.options import Ca, Head, Json, Token, TokenFile, connect
from farm.cli.render import console, node_json, node_state, nodes_table, print_json, show
from farm.proto.v1 import fleet_pb2

NodeRef = Annotated[str, typer.Argument(help="The node's id or name.", show_default=False)]


def nodes(json: Json = False, head: Head = None, token: Token = None, ca: Ca = None,
          token_file: TokenFile = None) -> None:
    """List the fleet's nodes, their state and their backends."""
    with connect(head, token, ca, token_file) as client:
        found = client.nodes()
    print_json([node_json(n) for n in found]) if json else show(nodes_table(found))


def drain(node: NodeRef, json: Json = False, head: Head = None, token: Token = None, ca: Ca = None,
          token_file: TokenFile = None) -> None:
    """Give a node no new shards; what runs there finishes. It stays drained across restarts until `farm undrain`."""
    _set_drain(node, True, json, head, token, ca, token_file)


def undrain(node: NodeRef, json: Json = False, head: Head = None, token: Token = None, ca: Ca = None,
            token_file: TokenFile = None) -> None:
    """Let a drained node take shards again."""
    _set_drain(node, False, json, head, token, ca, token_file)


def _set_drain(node: str, drain: bool, json: bool, head: str | None, token: str | None, ca: Path | None,
               token_file: Path | None) -> None:
    with connect(head, token, ca, token_file) as client:
        found = client.drain_node(client.resolve_node(node), drain)
    if json:
        print_json(node_json(found))
    else:
        console.print(f"node {found.name} ({found.id}) {'drained' if drain else 'undrained'}: "
                      f"{_drain_outcome(found, drain)}", highlight=False)


def _drain_outcome(node: fleet_pb2.Node, drain: bool) -> str:
    """What the drain or undrain did, in words. An undrained node may still read `draining` until the head's next
    refresh: it takes shards from that refresh on, which is what the user asked."""
    if drain:
        running = f", {node.shards_running} shards still running there" if node.shards_running else ""
        return f"{node_state(node)}{running}"
    if node.state == "offline":
        return "it takes shards again once it is back online"
    return "it takes new shards again"
