"""Kernel-eval jobs on the submitter's side: pack the problems and candidates folders into a job, build a spec for
`Client.evaluate_kernels`, and read a finished job's results table back.

The job's code holds only the two folders, at the paths the spec names (relative to the working directory), so the
head finds every (problem, candidate) pair in it: <problems>/<stem>.py and <candidates>/<stem>/<name>.py.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from farm.client.preflight import EXCLUDED_DIRS, MAX_CODE_BYTES, PreparedJob
from farm.core.errors import FarmError, SpecError
from farm.core.kernels import KernelResult, RewardMode, kernel_pairs
from farm.core.spec import JobSpec, KernelEvalSpec, parse_spec

if TYPE_CHECKING:
    from farm.client.api import Client

Problems = Sequence[str | Path] | Mapping[str, str | Path] | str | Path
Candidates = Mapping[str, Sequence[str | Path] | str | Path] | str | Path


def prepare_kernel_eval(spec: JobSpec, spec_yaml: str, workdir: Path) -> PreparedJob:
    """Check the two folders and zip them; items are the (problem, candidate) pairs."""
    if not isinstance(spec, KernelEvalSpec):
        raise SpecError(f"kind '{spec.kind.value}' is not kernel-eval")
    section = spec.kernel_eval
    workdir = workdir.resolve()
    buffer = io.BytesIO()
    total = 0
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for field, folder in (("problems", section.problems), ("candidates", section.candidates)):
            root = (workdir / folder).resolve()
            if not root.is_dir():
                raise SpecError(f"kernel_eval.{field}: folder {folder!r} not found in {workdir}")
            if not root.is_relative_to(workdir):
                raise SpecError(f"kernel_eval.{field}: {folder!r} is outside the working directory {workdir}")
            for path in sorted(root.rglob("*")):
                inside = path.relative_to(workdir)
                if (not path.is_file() or path.is_symlink() or inside.as_posix() in archive.namelist()
                        or any(p in EXCLUDED_DIRS or p.startswith(".") for p in inside.parts[:-1])):
                    continue
                total += path.stat().st_size
                if total > MAX_CODE_BYTES:
                    raise SpecError(f"kernel_eval: the two folders hold over {MAX_CODE_BYTES // 2**20} MB")
                archive.write(path, inside.as_posix())
        names = archive.namelist()
    pairs = kernel_pairs(names, section.problems, section.candidates)
    output = (workdir / spec.output_dir).resolve()
    return PreparedJob(spec, spec_yaml, buffer.getvalue(), len(pairs), output, 0)


def kernel_eval_spec(name: str, *, reward: RewardMode | str = RewardMode.SPEEDUP, backends: Sequence[str] = ("cuda",),
                     timeout_s: float = 60.0, memory_mb: int | None = 4096, runs: int = 20,
                     atol: float = 1e-4, rtol: float = 1e-4, output: Path | None = None) -> tuple[str, JobSpec]:
    """A kernel-eval spec over a working directory laid out as problems/ and candidates/ (see stage)."""
    data = {
        "name": name, "kind": "kernel-eval", "backends": list(backends), "tolerance": {"atol": atol, "rtol": rtol},
        "kernel_eval": {"problems": "problems", "candidates": "candidates", "reward": str(RewardMode(reward)),
                        "timeout_s": timeout_s, "memory_mb": memory_mb, "runs": runs},
        **({"output": str(output)} if output else {}),
    }
    text = yaml.safe_dump(data, sort_keys=False)
    return text, parse_spec(text, "evaluate_kernels")


def evaluate(client: Client, problems: Problems, candidates: Candidates, *, name: str = "kernel-eval",
             **options: object) -> list[KernelResult]:
    """Stage the files, submit a kernel-eval job, wait for it; its rows (a failed job raises its error)."""
    with stage(problems, candidates) as work:
        spec_yaml, spec = kernel_eval_spec(name, output=work / "out", **options)  # type: ignore[arg-type]
        job_id = client.submit_prepared(prepare_kernel_eval(spec, spec_yaml, work))
        final = None
        for final in client.watch(job_id):  # noqa: B007 (the last state is the one wanted)
            pass
        if final is None or final.state != "succeeded":
            raise FarmError(f"kernel-eval job {job_id} {final.state if final else 'vanished'}: "
                            f"{final.error if final else ''}".rstrip(": "))
        return read_results(final.output)


@contextmanager
def stage(problems: Problems, candidates: Candidates) -> Iterator[Path]:
    """A temporary working directory laid out as a kernel-eval job wants it.

    problems: a folder, a list of files, or {stem: file or source}; candidates: a folder laid out as <stem>/*.py, or
    {problem stem: [file or source, ...]} (a single one may stand alone). A value that names an existing .py file is
    that file; anything else is source text. Candidates are named by their file's stem, or c0000, c0001, ... when given
    as source.
    """
    with tempfile.TemporaryDirectory(prefix="farm-kernels-") as folder:
        work = Path(folder)
        (work / "problems").mkdir()
        (work / "candidates").mkdir()
        if isinstance(problems, (str, Path)) and Path(problems).is_dir():
            for path in Path(problems).glob("*.py"):
                shutil.copy(path, work / "problems" / path.name)
        else:
            items = problems.items() if isinstance(problems, Mapping) else ((None, p) for p in (
                [problems] if isinstance(problems, (str, Path)) else problems))
            for stem, value in items:
                source, named = _source(value)
                (work / "problems" / f"{stem or named or 'problem'}.py").write_text(source)
        if isinstance(candidates, (str, Path)):
            if not Path(candidates).is_dir():
                raise SpecError(f"candidates folder {candidates} not found")
            shutil.copytree(candidates, work / "candidates", dirs_exist_ok=True)
            candidates = {}
        for stem, values in candidates.items():
            folder_of = work / "candidates" / stem
            folder_of.mkdir(parents=True, exist_ok=True)
            listed = [values] if isinstance(values, (str, Path)) else list(values)
            for i, value in enumerate(listed):
                source, named = _source(value)
                (folder_of / f"{named or f'c{i:04d}'}.py").write_text(source)
        yield work


def _source(value: str | Path) -> tuple[str, str | None]:
    """(source text, file stem or None) of a file path or of source text."""
    if isinstance(value, Path) or (isinstance(value, str) and value.endswith(".py") and "\n" not in value):
        path = Path(value)
        if not path.is_file():
            raise SpecError(f"{path}: no such file")
        return path.read_text(), path.stem
    return str(value), None


def read_results(output: Path | str) -> list[KernelResult]:
    """A finished kernel-eval job's rows, from its output folder (results.jsonl)."""
    path = Path(output) / "results.jsonl"
    if not path.is_file():
        raise SpecError(f"{path.parent}: no results.jsonl (not a finished kernel-eval job's output)")
    return [KernelResult.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
