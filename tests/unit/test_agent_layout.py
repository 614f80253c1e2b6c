"""The agent's architecture, as the head's is tested (test_kinds): two wings and no import circle.

farm_agent.daemon is the long-lived process (registration, heartbeats, idle policy, hardware, settings, the work
stream and the workers' lives); farm_agent.work is what runs inside a worker (its loop, the shard harness, one module
per job kind under work/kinds, mirroring farm/head/kinds). farm_agent.entry is the one door both sides name. Every
import is counted, function-level ones too (the circle this replaced ran through a lazy import in entry.py), except
those under `if TYPE_CHECKING:`."""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agents" / "farm_agent"
HEAD_KINDS = Path(__file__).resolve().parents[2] / "farm" / "head" / "kinds"


def module_name(path: Path) -> str:
    parts = path.relative_to(AGENT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The farm_agent modules `path` imports anywhere in it, but under TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
               for child in node.body for n in ast.walk(child)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("farm_agent"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("farm_agent"))
    return found


def unit(module: str) -> str:
    """What a module counts as in the agent's layer graph: a top-level module, or one of its sub-packages whole
    (daemon, work, tuner, power, ...), whose inner lazy imports are that package's own business."""
    parts = module.split(".")
    return ".".join(parts[:2])


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in AGENT.rglob("*.py")}
    edges: dict[str, set[str]] = {unit(m): set() for m in modules}
    for name, path in modules.items():
        for target in imports(path):
            if target in modules and unit(target) != unit(name):
                edges[unit(name)].add(unit(target))
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle in the graph, if any (depth-first, the path on the stack)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_agents_parts_import_each_other_without_a_circle() -> None:
    assert cycle(graph()) == []


def test_the_work_wing_never_imports_the_daemon() -> None:
    edges = graph()
    assert "farm_agent.daemon" not in edges["farm_agent.work"]
    assert "farm_agent.daemon" not in edges["farm_agent.entry"]


def test_the_agents_kinds_mirror_the_heads() -> None:
    head = {p.stem for p in HEAD_KINDS.glob("*.py")} - {"__init__", "base"}
    agent = {p.stem for p in (AGENT / "work" / "kinds").glob("*.py")} - {"__init__"}
    assert agent == head


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_every_entry_point_on_the_wire_has_a_kind_that_runs_it() -> None:
    from farm.core.wire import ENTRY_TASKS
    from farm_agent.work.kinds import ATTEMPTS, attempt

    assert set(ATTEMPTS) == set(ENTRY_TASKS)
    assert all(callable(attempt(name)) for name in ATTEMPTS)
