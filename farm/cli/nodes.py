"""`farm nodes`."""

from __future__ import annotations

from farm.cli.options import Head, Json, Token, connect
from farm.cli.render import console, node_json, nodes_table, print_json


def nodes(json: Json = False, head: Head = None, token: Token = None) -> None:
    """List the fleet's nodes, their state and their backends."""
    with connect(head, token) as client:
        found = client.nodes()
    print_json([node_json(n) for n in found]) if json else console.print(nodes_table(found))
