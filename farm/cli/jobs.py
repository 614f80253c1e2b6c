"""`farm submit`, `farm jobs`, `farm job`, `farm logs`, `farm cancel`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from farm.cli.options import Head, Json, Token, connect
from farm.cli.render import (
    console, items_done, job_header, job_json, jobs_table, print_json, shards_table, sizes_by_device,
    summary_table,
)
from farm.client import Client
from farm.client.preflight import prepare
from farm.proto.v1 import job_pb2

JobId = Annotated[str, typer.Argument(help="The job's id (j-...).")]


def register(app: typer.Typer) -> None:
    app.command()(submit)
    app.command("jobs")(list_jobs)
    app.command()(job)
    app.command()(logs)
    app.command()(cancel)


def submit(
    spec: Annotated[Path, typer.Argument(help="The job spec (YAML).")],
    wait: Annotated[bool, typer.Option("--wait", help="Show progress until the job ends, then a summary.")] = False,
    workdir: Annotated[
        Path, typer.Option(help="The folder shipped as the job's code; model and dataset import from it.")
    ] = Path("."),
    json: Json = False,
    head: Head = None,
    token: Token = None,
) -> None:
    """Submit a job; prints its id."""
    with connect(head, token) as client:
        prepared = prepare(spec, workdir)
        job_id = client.submit_prepared(prepared)
        if not wait:
            print_json({"job_id": job_id}) if json else console.print(job_id)
            return
        final = follow(client, job_id, quiet=json)
    if json:
        print_json(job_json(final))
    else:
        show_summary(final)
        if final.state == "succeeded" and final.kind in RESULTS:
            RESULTS[final.kind](job_id, head, token)
    if final.state != "succeeded":
        raise typer.Exit(1)


def _kernel_results(job_id: str, head: str | None, token: str | None) -> None:
    from farm.cli.kernels import results_command

    results_command(job_id, json=False, head=head, token=token)


# What `farm submit --wait` prints after the summary of a job that succeeded, for kinds with a results table.
RESULTS: dict[str, Callable[[str, str | None, str | None], None]] = {"kernel-eval": _kernel_results}


def follow(client: Client, job_id: str, quiet: bool = False) -> job_pb2.Job:
    """Watch a job to its end, with a progress bar unless quiet."""
    last = None
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("items"),
        TimeElapsedColumn(), console=console, disable=quiet, transient=False,
    ) as progress:
        task = progress.add_task(job_id, total=None)
        for last in client.watch(job_id):
            progress.update(task, total=last.items, completed=items_done(last), description=f"{last.name} {last.state}")
    if last is None:
        raise RuntimeError("the head closed the watch stream without a job record")
    return last


def show_summary(job: job_pb2.Job) -> None:
    console.print(summary_table(job))
    metrics = dict(job.metrics)
    wall = job.finished_at - job.started_at if job.finished_at and job.started_at else 0.0
    trained = "step" in metrics and "loss" in metrics  # a training job's progress
    facts = [f"{job.items} items in {wall:.2f} s"]
    if trained:
        facts[0] = f"{metrics['step']:.0f} steps, {job.items} samples in {wall:.2f} s; final loss {metrics['loss']:.4f}"
    if job.energy_sources:
        above = f", {job.marginal_j:,.2f} J above idle" if job.HasField("marginal_j") else ""
        facts.append(f"{job.energy_j:,.2f} J ({', '.join(job.energy_sources)}){above}")
    if "loss" in metrics and not trained:  # an evaluate job's mean loss over the dataset
        facts.append(f"loss {metrics['loss']:.4f}")
    if "accuracy" in metrics:
        against = "the eval set" if trained else "the dataset's labels"
        facts.append(f"accuracy {metrics['accuracy']:.2%} against {against}")
    facts.append(f"output: {job.output}")
    console.print("   ".join(facts), highlight=False)
    if job.error:
        console.print(f"[red]error: {job.error}[/]")


def list_jobs(json: Json = False, head: Head = None, token: Token = None) -> None:
    """List recent jobs."""
    with connect(head, token) as client:
        jobs = client.list_jobs()
    print_json([job_json(j) for j in jobs]) if json else console.print(jobs_table(jobs))


def job(
    job_id: JobId,
    explain: Annotated[bool, typer.Option("--explain", help="Say why shards went where they went.")] = False,
    json: Json = False,
    head: Head = None,
    token: Token = None,
) -> None:
    """Show one job and its shards."""
    with connect(head, token) as client:
        record = client.job(job_id)
        lines = client.logs(job_id) if explain else []
    if json:
        print_json(job_json(record))
        return
    console.print(job_header(record), highlight=False)
    console.print(shards_table(record))
    if record.metrics:
        console.print("metrics: " + ", ".join(f"{k} {v:,.4g}" for k, v in sorted(record.metrics.items())))
    if explain:
        if record.explanation:
            console.print("[bold]last scheduling round[/] (the plan, each candidate's figures, what waits and why)")
            console.print("  " + record.explanation.replace("\n", "\n  "), highlight=False)
        sizes = sizes_by_device(record)
        if sizes:
            console.print("[bold]shard sizes per device[/] (rows, in the order they were cut; why: each placement)")
            for line in sizes:
                console.print(f"  {line}", highlight=False)
        console.print("[bold]placements[/] (each shard, where it went and the score it went on)")
        for line in lines:
            if "→" in line.message:
                console.print(f"  {line.message}", highlight=False)


def logs(job_id: JobId, json: Json = False, head: Head = None, token: Token = None) -> None:
    """Print a job's log."""
    with connect(head, token) as client:
        lines = client.logs(job_id)
    if json:
        print_json([{"ts": line.ts, "level": line.level, "message": line.message} for line in lines])
        return
    for line in lines:
        stamp = datetime.fromtimestamp(line.ts).strftime("%H:%M:%S.%f")[:-3]
        console.print(f"{stamp} {line.level:<7} {line.message}", highlight=False)


def cancel(job_id: JobId, json: Json = False, head: Head = None, token: Token = None) -> None:
    """Cancel a queued or running job."""
    with connect(head, token) as client:
        record = client.cancel(job_id)
    print_json(job_json(record)) if json else console.print(f"{record.id} {record.state}")
