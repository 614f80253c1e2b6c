"""YAML for what clients send: PyYAML's safe loader without aliases. An alias repeats what its anchor names, so nested
ones multiply: a 466-byte spec of ten levels stood for billions of nodes and stalled the head for 11 s. A job spec
has no use for them; each one is refused with its line."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent
from yaml.nodes import Node


class NoAliasLoader(yaml.SafeLoader):
    # index: a sequence position or a mapping's key node (types-PyYAML says int only)
    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]  # unannotated in types-PyYAML
            raise ComposerError(None, None, "aliases (*name) are not allowed", event.start_mark)
        return super().compose_node(parent, index)


def load(text: str) -> Any:
    """yaml.safe_load, refusing aliases (yaml.YAMLError with the alias's line)."""
    return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 (a SafeLoader)
