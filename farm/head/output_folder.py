"""Whose results an output folder holds: a job refuses a folder that holds another job's results unless the submitter
asked to overwrite them (then they are removed first), so that two jobs never mix their shards in one folder.
(farm.head.output_place keeps a job out of an unfinished job's folder and out of the head's own.) Nothing is created
here: the folder appears with the job's first result."""

from __future__ import annotations

import shutil
from pathlib import Path

from farm.core.errors import ConflictError, SpecError
from farm.data.locations import join
from farm.data.results import Results

# What a job writes into its folder (every kind's results, the manifest, unfinished writes): found to tell a folder
# of results, and removed on overwrite. Anything else in the folder is the user's and stays.
RESULT_PATTERNS = ("shard-*", ".shard-*", "_manifest.json", "._manifest.json.*", "manifest.json", ".manifest.json.*",
                   "results.jsonl", "results.csv", "model.pt", "*.parquet")


def claim(output: Path, overwrite: bool) -> None:
    """Let a new job write into `output`: ConflictError when it holds results and `overwrite` is off; with it, they
    are removed."""
    results = _results(output)
    if not results:
        return
    if not overwrite:
        raise ConflictError(f"output {output} already holds another job's results ({results[0].name}, ...): choose "
                            "another output, or overwrite them (farm submit --overwrite)")
    try:
        for path in results:
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise SpecError(f"output {output}: cannot remove the results there: {exc.strerror}") from None


def remove_results(output: str) -> None:
    """Remove a deleted job's results (`farm jobs delete --outputs`): in a folder what a job writes there (its
    checkpoints too), then the folder if nothing else is left in it; in a bucket its shards and manifest."""
    results = Results(output)
    if not results.local:
        for name, _ in results.files():
            results.fs.rm_file(join(results.root, name))
        return
    folder = Path(output)
    for path in _results(folder):
        path.unlink(missing_ok=True)
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    try:
        folder.rmdir()
    except OSError:  # the user's own files stay, and with them the folder (or it was never made)
        pass


def _results(output: Path) -> list[Path]:
    try:
        return sorted({path for pattern in RESULT_PATTERNS for path in output.glob(pattern) if path.is_file()})
    except OSError:  # not a folder we can read: the job's first write will say why
        return []
