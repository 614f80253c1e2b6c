"""`farm results JOB`: a job's results from its head (finished, or what is done so far), into a folder."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from farm.cli.options import Ca, Head, Json, Token, TokenFile, connect
from farm.cli.render import console, print_json
from farm.client.results import FORMATS, convert, download
from farm.core.errors import DataError, UserError

# With --format jsonl or npy the shards' Parquet files are fetched into this hidden folder of --out (a broken download
# resumes from it), converted, then removed: the folder holds the format asked for, not both.
STAGING = ".parquet"


def results(
    job_id: Annotated[str, typer.Argument(help="The job's id (j-..., or the start of it).")],
    out: Annotated[Path | None, typer.Option("--out", help="The folder to fill (default: ./JOB_ID).")] = None,
    fmt: Annotated[str, typer.Option("--format", help=f"{' | '.join(FORMATS)}: the shards' Parquet files as they "
                                     "are; or one results.jsonl in row order; or results.npy (the outputs) with "
                                     "row_ids.npy and one NAME.npy per passthrough column, in row order.")
                   ] = "parquet",
    json: Json = False,
    head: Head = None,
    token: Token = None,
    ca: Ca = None,
    token_file: TokenFile = None,
) -> None:
    """Download a job's results (needs the API token); a broken download resumes where it stopped."""
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}")
    with connect(head, token, ca, token_file) as client, Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=console, disable=json, transient=False,
    ) as progress:
        job_id = client.resolve_job(job_id)
        folder = out or Path(job_id)
        fetch_into = folder if fmt == "parquet" else folder / STAGING
        task = progress.add_task(job_id, total=None)
        fetched = download(client, job_id, fetch_into, lambda done, total: progress.update(task, completed=done,
                                                                                          total=total))
    shards = [p for p in fetched.files if p.name.startswith("shard-")]
    written, left_out = _converted(fetch_into, folder, fmt)
    if json:
        print_json({"job_id": job_id, "state": fetched.state, "out": str(folder), "shards": len(shards),
                    "bytes": fetched.total, "fetched": fetched.fetched,
                    "file": str(written[0]) if written else None, "files": [str(p) for p in written],
                    "left_out": left_out})
        return
    note = "" if fetched.state == "succeeded" else f" (the job is {fetched.state}: the shards finished so far)"
    what = f"{len(shards)} shard files in {folder}" if fmt == "parquet" else \
        f"{len(shards)} shards into {', '.join(p.name for p in written)} in {folder}"
    skipped = "; not in npy: " + "; ".join(f"{k} ({v})" for k, v in left_out.items()) if left_out else ""
    console.print(f"{what}{note}{skipped}", highlight=False, soft_wrap=True)


def _converted(staging: Path, folder: Path, fmt: str) -> tuple[list[Path], dict[str, str]]:
    """The files of `fmt` made from the Parquet files in `staging`, moved into `folder` (staging then removed), and
    the passthrough columns npy could not hold, with why."""
    made = convert(staging, fmt) if fmt != "parquet" else None
    if made is None:  # parquet: the files are the result
        return [], {}
    written = [made] + ([staging / "row_ids.npy"] if fmt == "npy" else [])
    left_out = _passthrough_npy(staging, written) if fmt == "npy" else {}
    moved = []
    for path in written:
        target = folder / path.name
        path.replace(target)
        moved.append(target)
    shutil.rmtree(staging)
    return moved, left_out


def _passthrough_npy(staging: Path, written: list[Path]) -> dict[str, str]:
    """Each passthrough column of the results (what the dataset gave beside the model's input) as NAME.npy in row
    order, beside results.npy, appended to `written`; the columns npy cannot hold, with why (nulls, ragged lists)."""
    import numpy as np

    from farm.core.dataset import ROW_ID
    from farm.data.batches import column_to_numpy
    from farm.data.results import OUTPUT, Results

    table = Results(str(staging.resolve())).read_table()
    ids = table.column(ROW_ID).to_pylist()
    taken = {p.name for p in written}
    left_out = {}
    for name in table.column_names:
        if name in (ROW_ID, OUTPUT):
            continue
        try:
            array = column_to_numpy(table.column(name), name, ids, "results")
        except DataError as exc:
            left_out[name] = exc.message.removeprefix("results ")
            continue
        if array.dtype == object:  # strings or bytes: npy holds them as fixed-width arrays, never pickled
            array = np.asarray(array.tolist())
        if array.dtype == object:
            left_out[name] = "mixed values"
            continue
        file = re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".npy"
        if file in taken:  # a column called `results` or `row_ids`
            file = f"column-{file}"
        np.save(staging / file, array, allow_pickle=False)
        taken.add(file)
        written.append(staging / file)
    return left_out
