"""Before a job leaves the user's machine: its code must import, its data load, and both fit in one archive."""

from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from farm.core.errors import SpecError
from farm.core.spec import JobKind, JobSpec, parse_spec

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
    """Parse the spec, load its model and dataset as a node would, and zip the working directory."""
    spec_yaml, spec = read_spec(spec_path, workdir)
    if spec.kind is JobKind.KERNEL_EVAL:  # no model nor dataset: folders of problems and candidates
        from farm.client.kernels import prepare_kernel_eval

        return prepare_kernel_eval(spec, spec_yaml, workdir)
    workdir = workdir.resolve()
    from farm_agent.jobcode import load_dataset, load_model

    inputs, _ = load_dataset(spec.dataset, workdir)
    if spec.training is not None and spec.training.eval_dataset:
        load_dataset(spec.training.eval_dataset, workdir)
    model = load_model(spec.model, spec.weights, workdir)
    model_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    output = (workdir / spec.output_dir).resolve()
    return PreparedJob(spec, spec_yaml, zip_code(workdir, skip=output), len(inputs), output, model_bytes)


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
