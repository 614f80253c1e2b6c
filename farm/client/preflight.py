"""Before a job leaves the user's machine: its code must import, its data load, and both fit in one archive."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.client.check import Preflight, check_job
from farm.core.dataset import Location
from farm.core.errors import SpecError
from farm.core.spec import JobSpec, ModelJobSpec, parse_spec

# Never shipped with a job: environments, caches, hidden folders and files (VCS data, tool state, .env, .netrc), and
# what the folder's git repository ignores.
EXCLUDED_DIRS = {"venv", "__pycache__", "node_modules"}
MAX_CODE_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class PreparedJob:
    spec: JobSpec
    spec_yaml: str
    code_zip: bytes
    items: int
    output: Path | str  # a folder on the head's machine, or a bucket's URL (s3://bucket/prefix)
    model_bytes: int  # parameters and buffers: the least memory a node needs to hold the model
    dataset_location: str = ""  # a located dataset's location, a relative path made absolute (the head plans it)


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


def prepare(spec_path: Path, workdir: Path, check: bool = True,
            before_check: Callable[[Path | str], None] | None = None) -> PreparedJob:
    """Parse the spec, zip the working directory, and load the dataset and build and run the model on a small batch
    as a node would, in the job's environment (farm.client.check; the model not with `check` off) — unless this
    machine did so before for the same code, spec and Python environment. `before_check(output)` may refuse the job
    first, on what takes no seconds to know (its output folder)."""
    spec_yaml, spec = read_spec(spec_path, workdir)
    if not isinstance(spec, ModelJobSpec):  # no model nor dataset: kernel-eval's folders of problems and candidates
        from farm.client.kernels import prepare_kernel_eval

        return prepare_kernel_eval(spec, spec_yaml, workdir)
    workdir = workdir.resolve()
    output: Path | str = spec.output_dir if "://" in spec.output_dir else (workdir / spec.output_dir).resolve()
    if before_check is not None:
        before_check(output)
    skip = [output] if isinstance(output, Path) else []
    location = ""
    located = spec.located_dataset
    if located is not None:  # read by the head (planning) and the nodes; here only its preprocess is imported
        location = located.location
        if located.where is Location.HEAD and not location.startswith(("/", "~")):  # (a ~ is the head's home)
            location = str((workdir / location).resolve())
            skip.append(Path(location))  # the head serves it to the nodes: not in the code too
    code_zip = zip_code(workdir, skip=skip)
    key = model_key(spec, code_zip)
    found = PreflightCache().get(key)
    if found is None or (check and not found.checked):
        found = check_job(spec, workdir, check)
        PreflightCache().put(key, found)
    return PreparedJob(spec, spec_yaml, code_zip, found.items, output, found.model_bytes, location)


def model_key(spec: ModelJobSpec, code_zip: bytes) -> str:
    """What a model's size and check depend on: its callable, weights and dataset, the job's environment, its code
    (weights included) and the Python environment it imports from (site-packages changes when a package is installed
    or removed)."""
    environment = Path(sysconfig.get_paths()["purelib"])
    digest = hashlib.sha256(
        f"{spec.model}\0{spec.weights or ''}\0{spec.dataset}\0{sys.version}\0{sys.prefix}\0".encode())
    digest.update(json.dumps([spec.env, spec.requirements, spec.find_links], sort_keys=True).encode())
    digest.update(str(environment.stat().st_mtime_ns if environment.exists() else 0).encode())
    digest.update(code_zip)
    return digest.hexdigest()


class PreflightCache:
    """What this machine's preflights found, by model_key: loading a dataset and building and running a model take
    seconds (importing their libraries, loading weights) and users submit the same job again and again. A file of its
    own, rewritten whole (atomically); an entry missing or unreadable is found again."""

    LIMIT = 256  # entries kept, the newest

    def __init__(self, path: Path | None = None) -> None:
        cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        self.path = path or cache_home / "farm" / "preflight.json"

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in entries.items() if isinstance(v, dict)} if isinstance(entries, dict) else {}

    def get(self, key: str) -> Preflight | None:
        try:
            return Preflight(**self._read()[key])
        except (KeyError, TypeError):
            return None

    def put(self, key: str, found: Preflight) -> None:
        entries = self._read()
        entries.pop(key, None)
        entries[key] = dataclasses.asdict(found)
        kept = dict(list(entries.items())[-self.LIMIT:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(kept))
            os.replace(temporary, self.path)
        except OSError:  # a read-only home: found again next time
            pass


def zip_code(root: Path, skip: Path | list[Path] | None = None) -> bytes:
    skipped = set([skip] if isinstance(skip, Path) else skip or [])
    buffer = io.BytesIO()
    total = 0
    ignored = git_ignored(root)
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for folder, dirs, files in os.walk(root):
            here = Path(folder)
            dirs[:] = sorted(
                d for d in dirs
                if d not in EXCLUDED_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
                and here / d not in skipped and here / d not in ignored
            )
            for name in sorted(files):
                path = here / name
                if name.startswith(".") or path.is_symlink() or not path.is_file() or path in ignored:
                    continue
                total += path.stat().st_size
                if total > MAX_CODE_BYTES:
                    raise SpecError(
                        f"the working directory {root} holds over {MAX_CODE_BYTES // 2**20} MB: "
                        "submit from a smaller folder (--workdir)"
                    )
                archive.write(path, path.relative_to(root).as_posix())
    return buffer.getvalue()


def git_ignored(root: Path) -> set[Path]:
    """The files and folders under `root` that its git repository ignores (.gitignore, .git/info/exclude, the user's
    excludes), as git itself reads them; none when `root` is not in a repository or git is not installed."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "--others", "--ignored", "--exclude-standard", "--directory", "-z"],
            capture_output=True, timeout=60, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return set()
    if listed.returncode != 0:
        return set()
    return {root / name.rstrip("/") for name in listed.stdout.decode(errors="surrogateescape").split("\0") if name}
