"""Backends, one per module, imported lazily so that one that cannot load says why instead of breaking the agent."""

from __future__ import annotations

import importlib
from types import ModuleType

from farm.core.models import BackendName, BackendOffer, Hardware

# The backends this agent knows how to run: one module per backend, named by it. Each module has
# `offers(hardware, cpus)` and `run(...)` (see base.Backend).
MODULES: dict[BackendName, str] = {name: f"farm_agent.backends.{name.value}" for name in BackendName}


def load(name: str) -> ModuleType:
    return importlib.import_module(MODULES[BackendName(name)])


def offers(hardware: Hardware, cpus: int) -> list[BackendOffer]:
    found: list[BackendOffer] = []
    for name, module_name in MODULES.items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # an optional backend's dependency is missing or broken: report it, go on
            found.append(BackendOffer(name=name, device=name.value, available=False, slots=0, reason=str(exc)))
            continue
        found.extend(module.offers(hardware, cpus))
    return found
