"""`farm results JOB`: a job's results from its head (finished, or what is done so far), into a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from farm.cli.options import Head, Json, Token, connect
from farm.cli.render import console, print_json
from farm.client.results import FORMATS, convert, download
from farm.core.errors import UserError


def results(
    job_id: Annotated[str, typer.Argument(help="The job's id (j-...).")],
    out: Annotated[Path | None, typer.Option("--out", help="The folder to fill (default: ./JOB_ID).")] = None,
    fmt: Annotated[str, typer.Option("--format", help=f"{' | '.join(FORMATS)}: the shards' Parquet files as they "
                                     "are, or also one results.jsonl / results.npy in row order.")] = "parquet",
    json: Json = False,
    head: Head = None,
    token: Token = None,
) -> None:
    """Download a job's results (needs the API token); a broken download resumes where it stopped."""
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}")
    folder = out or Path(job_id)
    with connect(head, token) as client, Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=console, disable=json, transient=False,
    ) as progress:
        task = progress.add_task(job_id, total=None)
        fetched = download(client, job_id, folder, lambda done, total: progress.update(task, completed=done,
                                                                                      total=total))
    converted = convert(folder, fmt)
    shards = [p for p in fetched.files if p.name.startswith("shard-")]
    if json:
        print_json({"job_id": job_id, "state": fetched.state, "out": str(folder), "shards": len(shards),
                    "bytes": fetched.total, "fetched": fetched.fetched,
                    "file": str(converted) if converted else None})
        return
    note = "" if fetched.state == "succeeded" else f" (the job is {fetched.state}: the shards finished so far)"
    console.print(f"{len(shards)} shard files in {folder}{note}" + (f"; {converted}" if converted else ""),
                  highlight=False)
