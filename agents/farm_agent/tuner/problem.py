"""Problems in the common format: a Python file defining `class Model(torch.nn.Module)`, `get_inputs()` (the
forward's arguments) and `get_init_inputs()` (Model's constructor arguments).

Loading a problem imports its file, so it runs the problem's code; problems are trusted the way a job's model is.
Candidate files (user code under test) are never imported here: see `candidate_defines_model_new`.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from farm.core.errors import NotFoundError, SpecError

MODEL_SEED = 1234
"""Model (and a candidate's ModelNew) are built under this seed, so that both draw the same initial weights."""


@dataclass(frozen=True)
class Problem:
    """One problem file, imported."""

    path: Path
    name: str  # the file's stem
    module: ModuleType = field(repr=False, compare=False)

    def init_inputs(self) -> list[Any]:
        return list(self.module.get_init_inputs())

    def model(self, device: str | torch.device) -> torch.nn.Module:
        """Model(*get_init_inputs()) built under MODEL_SEED directly on `device` (creating weights where they live
        is much faster than building a large model on the CPU and copying it), in eval mode."""
        with torch.device(device):
            torch.manual_seed(MODEL_SEED)
            model = self.module.Model(*self.init_inputs())
        return model.to(device).eval()

    def inputs(self, device: str | torch.device, seed: int) -> list[Any]:
        """get_inputs() under torch.manual_seed(seed), its tensors created on (or moved to) `device`. The same seed
        gives the same inputs on the same kind of device; CPU and CUDA random streams differ."""
        with torch.device(device):
            torch.manual_seed(seed)
            values = list(self.module.get_inputs())
        return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def load_problem(path: Path | str) -> Problem:
    """Import a problem file and check its shape; a bad file raises SpecError (NotFoundError when missing) with a
    one-line message."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise NotFoundError(f"problem file {path} not found")
    module = _import_file(path, "farm_problem")
    missing = [name for name in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, name)]
    if missing:
        raise SpecError(f"problem {path.name} defines no {', '.join(missing)}")
    if not (isinstance(module.Model, type) and issubclass(module.Model, torch.nn.Module)):
        raise SpecError(f"problem {path.name}: Model is not a torch.nn.Module subclass")
    for name in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(module, name)):
            raise SpecError(f"problem {path.name}: {name} is not a function")
    return Problem(path=path, name=path.stem, module=module)


def problem_paths(path: Path | str) -> list[Path]:
    """One problem file, or every problem file in a folder (files starting with '_' are helpers), sorted."""
    path = Path(path).expanduser().resolve()
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
        if not found:
            raise NotFoundError(f"no problem files (*.py) in {path}")
        return found
    raise NotFoundError(f"problem path {path} not found")


def candidate_defines_model_new(path: Path | str) -> None:
    """Check, without running it, that a candidate file parses and defines ModelNew at its top level. The candidate
    is user code: only the evaluator's child process imports it."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise NotFoundError(f"candidate file {path} not found")
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, ValueError) as exc:
        raise SpecError(f"candidate {path.name} does not parse: {exc}") from None
    if "ModelNew" not in _top_level_names(tree):
        raise SpecError(f"candidate {path.name} defines no class ModelNew")


def import_candidate(path: Path) -> type[torch.nn.Module]:
    """Import a candidate file and return its ModelNew (in the evaluator's child process only)."""
    module = _import_file(path, "farm_candidate", add_folder_to_path=True)
    model_new = getattr(module, "ModelNew", None)
    if not isinstance(model_new, type) or not issubclass(model_new, torch.nn.Module):
        raise SpecError(f"candidate {path.name}: ModelNew is not a torch.nn.Module subclass")
    return model_new


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _import_file(path: Path, prefix: str, add_folder_to_path: bool = False) -> ModuleType:
    # A unique module name per file, registered in sys.modules while it runs (dataclasses and pickling look there).
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"{prefix}_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SpecError(f"{path.name} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if add_folder_to_path and str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))  # a candidate may import helpers that sit next to it
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the file's own code failed: say how, in one line
        del sys.modules[name]
        raise SpecError(f"{path.name} does not import: {type(exc).__name__}: {one_line(str(exc))}") from None
    return module


def one_line(text: str, limit: int = 300) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."
