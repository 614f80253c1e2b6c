"""Identifiers: short, random, with a prefix that says what they name."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


# The Ray node label a trusted node's Ray worker carries (training's actors are pinned to it), and the variable an
# agent names its node to its workers with.
NODE_LABEL = "farm.io/node"
NODE_ID_VAR = "FARM_NODE_ID"
