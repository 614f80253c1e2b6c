"""Before a job leaves the user's machine: its code must import, its data load, and both fit in one archive."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

from farm.core.errors import SpecError
from farm.core.spec import JobSpec, ModelJobSpec, parse_spec

# Never shipped with a job: environments, caches, and hidden folders (VCS data, tool state).
EXCLUDED_DIRS = {"venv", "__pycache__", "node_modules"}
MAX_CODE_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class PreparedJob:
    spec: JobSpec
    spec_yaml: str
    code_zip: bytes
    items: int
    output: Path
    model_bytes: int  # parameters and buffers: the least memory a node needs to hold the model


def read_spec(spec_path: Path, workdir: Path) -> tuple[str, JobSpec]:
    """A spec file's text and its parsed spec, checked along with the working directory it imports from."""
    try:
        spec_yaml = spec_path.read_text()
    except FileNotFoundError:
        raise SpecError(f"{spec_path}: no such file") from None
    except (IsADirectoryError, UnicodeDecodeError, PermissionError) as exc:
        raise SpecError(f"{spec_path}: cannot read: {exc}") from None
    spec = parse_spec(spec_yaml, str(spec_path))
    if not workdir.is_dir():
        raise SpecError(f"working directory {workdir} does not exist")
    return spec_yaml, spec


def prepare(spec_path: Path, workdir: Path) -> PreparedJob:
    """Parse the spec, load its dataset (and its model, unless this code's model was measured here before) as a node
    would, and zip the working directory."""
    spec_yaml, spec = read_spec(spec_path, workdir)
    if not isinstance(spec, ModelJobSpec):  # no model nor dataset: kernel-eval's folders of problems and candidates
        from farm.client.kernels import prepare_kernel_eval

        return prepare_kernel_eval(spec, spec_yaml, workdir)
    workdir = workdir.resolve()
    from farm_agent.jobcode import build_model, load_dataset

    inputs, _ = load_dataset(spec.dataset, workdir)
    for extra in spec.datasets[1:]:  # training's eval set
        load_dataset(extra, workdir)
    output = (workdir / spec.output_dir).resolve()
    code_zip = zip_code(workdir, skip=output)
    key = model_key(spec, code_zip)
    model_bytes = ModelBytesCache().get(key)
    if model_bytes is None:  # code not built here before: build it, which checks it (and its weights) too
        model = build_model(spec.model, spec.weights, workdir)
        model_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        ModelBytesCache().put(key, model_bytes)
    return PreparedJob(spec, spec_yaml, code_zip, len(inputs), output, model_bytes)


def model_key(spec: ModelJobSpec, code_zip: bytes) -> str:
    """What a model's size depends on: its callable and weights, the job's code (weights included) and the Python
    environment it imports from (site-packages changes when a package is installed or removed)."""
    environment = Path(sysconfig.get_paths()["purelib"])
    digest = hashlib.sha256(f"{spec.model}\0{spec.weights or ''}\0{sys.version}\0{sys.prefix}\0".encode())
    digest.update(str(environment.stat().st_mtime_ns if environment.exists() else 0).encode())
    digest.update(code_zip)
    return digest.hexdigest()


class ModelBytesCache:
    """The model sizes this machine measured, by model_key: building a model to measure it takes seconds (importing
    its libraries, loading its weights) and users submit the same job again and again. A file of its own, rewritten
    whole (atomically); a figure missing or unreadable is measured again."""

    LIMIT = 256  # entries kept, the newest

    def __init__(self, path: Path | None = None) -> None:
        cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        self.path = path or cache_home / "farm" / "model-bytes.json"

    def _read(self) -> dict[str, int]:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in entries.items() if isinstance(v, int)} if isinstance(entries, dict) else {}

    def get(self, key: str) -> int | None:
        return self._read().get(key)

    def put(self, key: str, model_bytes: int) -> None:
        entries = self._read()
        entries.pop(key, None)
        entries[key] = model_bytes
        kept = dict(list(entries.items())[-self.LIMIT:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(kept))
            os.replace(temporary, self.path)
        except OSError:  # a read-only home: measure again next time
            pass


def zip_code(root: Path, skip: Path | None = None) -> bytes:
    buffer = io.BytesIO()
    total = 0
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for folder, dirs, files in os.walk(root):
            here = Path(folder)
            dirs[:] = sorted(
                d for d in dirs
                if d not in EXCLUDED_DIRS and not d.startswith(".") and not d.endswith(".egg-info") and here / d != skip
            )
            for name in sorted(files):
                path = here / name
                if path.is_symlink() or not path.is_file():
                    continue
                total += path.stat().st_size
                if total > MAX_CODE_BYTES:
                    raise SpecError(
                        f"the working directory {root} holds over {MAX_CODE_BYTES // 2**20} MB: "
                        "submit from a smaller folder (--workdir)"
                    )
                archive.write(path, path.relative_to(root).as_posix())
    return buffer.getvalue()
