"""`farm submit`, `farm jobs [delete|prune]`, `farm job`, `farm logs`, `farm cancel`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from farm.cli.options import Ca, Head, Json, Token, TokenFile, connect, duration, reattach_prefix
from farm.cli.render import (
    console, count, errors, figure, items_done, job_header, job_json, jobs_table, log_line_json, print_json,
    print_log_line, print_whole, read_routes, shards_table, show, sizes_by_device, summary_table, time_by_device,
)
from farm.client import Client
from farm.client.api import through_restarts
from farm.client.preflight import prepare
from farm.core.errors import UserError
from farm.core.models import JobState
from farm.core.tasks import VERBOSE
from farm.proto import convert
from farm.proto.v1 import job_pb2

JobId = Annotated[str, typer.Argument(help="The job's id (j-...), or the start of it.")]
RECONNECT_S = 120.0  # how long `--wait` and `--follow` wait for a head that went away


def register(app: typer.Typer) -> None:
    app.command()(submit)
    app.add_typer(jobs_app, name="jobs")
    app.command()(job)
    app.command()(logs)
    app.command()(cancel)


def submit(
    spec: Annotated[Path, typer.Argument(help="The job spec (YAML).")],
    wait: Annotated[bool, typer.Option("--wait", help="Show progress until the job ends, then a summary.")] = False,
    workdir: Annotated[
        Path, typer.Option(help="The folder shipped as the job's code; model and dataset import from it.")
    ] = Path("."),
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="The output folder may hold another job's results: remove them.")
    ] = False,
    no_check: Annotated[
        bool, typer.Option("--no-check", help="Do not build and run the model on a small batch here (nor install the "
                     "job's requirements here) before sending the job.")
    ] = False,
    json: Json = False,
    head: Head = None,
    token: Token = None,
    ca: Ca = None,
    token_file: TokenFile = None,
) -> None:
    """Submit a job; prints its id."""
    with connect(head, token, ca, token_file) as client:
        prepared = prepare(spec, workdir, check=not no_check,
                           before_check=None if overwrite else lambda output: _output_free(client, output))
        job_id = client.submit_prepared(prepared, overwrite=overwrite)
        if not wait:
            print_json({"job_id": job_id}) if json else console.print(job_id)
            return
        final = follow(client, job_id, quiet=json)
    end_of_wait(final, json, head, token, ca, token_file)


def _output_free(client: Client, output: Path | str) -> None:
    """Refuse a job whose output folder holds another job's results before its model check (seconds), as the head
    would after it: where the folder can be seen, on the local head's machine (a remote head's folder is its own)."""
    if client.head.pid and isinstance(output, Path):
        from farm.head.output_folder import check_free

        check_free(output)


def end_of_wait(final: job_pb2.Job, json: bool, head: str | None, token: str | None, ca: Path | None,
                token_file: Path | None) -> None:
    """What `--wait` prints once the job ended; exit 1 unless it succeeded."""
    if json:
        print_json(job_json(final))
    else:
        show_summary(final)
        if final.state == "succeeded" and final.kind in RESULTS:
            RESULTS[final.kind](final.id, head, token, ca, token_file)
    if final.state != "succeeded":
        raise typer.Exit(1)


def _kernel_results(job_id: str, head: str | None, token: str | None, ca: Path | None, token_file: Path | None
                    ) -> None:
    from farm.cli.kernels import results_command

    results_command(job_id, json=False, head=head, token=token, ca=ca, token_file=token_file)


# What `farm submit --wait` prints after the summary of a job that succeeded, for kinds with a results table (given
# the job's id and the options that reach its head).
RESULTS: dict[str, Callable[[str, str | None, str | None, Path | None, Path | None], None]] = {
    "kernel-eval": _kernel_results}


def follow(client: Client, job_id: str, quiet: bool = False) -> job_pb2.Job:
    """Watch a job to its end, with a progress bar unless quiet. Ctrl-C leaves the job running and says how to
    come back to it (exit 130)."""
    last = None
    try:
        with Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("items"),
            TimeElapsedColumn(), console=console, disable=quiet, transient=False,
        ) as progress:
            task = progress.add_task(job_id, total=None)
            for last in through_restarts(lambda: client.watch(job_id), RECONNECT_S, head_gone):
                progress.update(task, total=last.items, completed=items_done(last),
                                description=f"{last.name} {last.state}")
    except KeyboardInterrupt:
        detach(client, job_id)
    if last is None:
        raise RuntimeError("the head closed the watch stream without a job record")
    return last


def head_gone() -> None:
    errors.print(f"the head does not answer; trying again for {RECONNECT_S} s (Ctrl-C leaves the job running)",
                 highlight=False, soft_wrap=True)


def detach(client: Client, job_id: str) -> NoReturn:
    """Stop following a job (Ctrl-C): it keeps running; say how to come back to it (exit 130, as for SIGINT)."""
    before, after = reattach_prefix(client)
    errors.print(f"job {job_id} keeps running; follow it again with `{before} job {job_id} --wait{after}` or "
                 f"`{before} logs {job_id} --follow{after}`", highlight=False, soft_wrap=True)
    raise typer.Exit(130)


def show_summary(job: job_pb2.Job) -> None:
    print_whole(summary_table(job))
    metrics = dict(job.metrics)
    # The head's wall time (less the time a retried job lay ended between runs), else the clock's
    wall = metrics.get("wall_s") or (job.finished_at - job.started_at if job.finished_at and job.started_at else 0.0)
    trained = "step" in metrics and "loss" in metrics  # a training job's progress
    done = items_done(job)
    facts = [f"{count(job.items)} items in {wall:.2f} s" if done == job.items
             else f"{count(done)} of {count(job.items)} items done"]
    if trained:
        facts[0] = (f"{metrics['step']:,.0f} steps, {count(job.items)} samples in {wall:.2f} s; final loss "
                    f"{metrics['loss']:.4f}")
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


jobs_app = typer.Typer(help="List recent jobs; `delete` and `prune` forget finished ones.",
                       invoke_without_command=True)


@jobs_app.callback()
def list_jobs(ctx: typer.Context, json: Json = False, head: Head = None, token: Token = None, ca: Ca = None,
              token_file: TokenFile = None) -> None:
    """List recent jobs."""
    if ctx.invoked_subcommand is not None:
        return
    with connect(head, token, ca, token_file) as client:
        jobs = client.list_jobs()
    print_json([job_json(j) for j in jobs]) if json else show(jobs_table(jobs))


Outputs = Annotated[bool, typer.Option("--outputs", help="Remove their results too (not where another job on "
                                                         "record writes).")]


@jobs_app.command("delete")
def delete_jobs(job_ids: Annotated[list[str], typer.Argument(help="The jobs' ids (j-...).")], outputs: Outputs = False,
                json: Json = False, head: Head = None, token: Token = None, ca: Ca = None,
                token_file: TokenFile = None) -> None:
    """Forget finished jobs: their records, logs, code and files on the head (a queued or running one is refused:
    nothing is deleted then)."""
    with connect(head, token, ca, token_file) as client:
        deleted = client.delete_jobs([client.resolve_job(j) for j in job_ids], outputs)
    _print_deleted(deleted, json)


@jobs_app.command("prune")
def prune_jobs(
    older_than: Annotated[str | None, typer.Option(
        "--older-than", help="Only jobs that ended at least this long ago: 12h, 7d (default: every finished job).")
    ] = None,
    state: Annotated[list[str] | None, typer.Option(
        "--state", help="Only jobs that ended so: succeeded, failed or cancelled (repeatable; default: all three).")
    ] = None,
    outputs: Outputs = False, json: Json = False, head: Head = None, token: Token = None, ca: Ca = None,
    token_file: TokenFile = None,
) -> None:
    """Delete every finished job (of these states, that ended long enough ago), as `farm jobs delete` does."""
    seconds = duration(older_than, "--older-than") if older_than else 0.0
    with connect(head, token, ca, token_file) as client:
        deleted = client.prune_jobs(seconds, state or [], outputs)
    _print_deleted(deleted, json)


def _print_deleted(deleted: list[job_pb2.DeletedJob], json: bool) -> None:
    if json:
        print_json([convert.to_dict(d) for d in deleted])
        return
    for d in deleted:
        results = " and its results" if d.outputs_removed else f"; its results stay: {d.outputs_kept}" \
            if d.outputs_kept else ""
        console.print(f"deleted {d.id} ({d.name}, {d.state}){results}", highlight=False)
    console.print(f"{len(deleted)} job{'s' if len(deleted) != 1 else ''} deleted", highlight=False)


def job(
    job_id: JobId,
    explain: Annotated[bool, typer.Option("--explain", help="Say why shards went where they went.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job to its end (re-attach), then a summary.")
                    ] = False,
    retry_missing: Annotated[bool, typer.Option(
        "--retry-missing", help="Run a job that ended (failed, cancelled, or succeeded with rows skipped) again for "
        "only its shards without a result, into the same output; with --wait, follow it.")] = False,
    json: Json = False,
    head: Head = None,
    token: Token = None,
    ca: Ca = None,
    token_file: TokenFile = None,
) -> None:
    """Show one job and its shards; or run its missing rows again (--retry-missing)."""
    if retry_missing:
        with connect(head, token, ca, token_file) as client:
            record = client.retry_missing(client.resolve_job(job_id))
        if json and not wait:
            print_json(job_json(record))
        elif not json:
            console.print(retry_line(record), highlight=False)
        if not wait:
            return
    if wait:
        with connect(head, token, ca, token_file) as client:
            final = follow(client, client.resolve_job(job_id), quiet=json)
        end_of_wait(final, json, head, token, ca, token_file)
        return
    with connect(head, token, ca, token_file) as client:
        record = client.job(client.resolve_job(job_id))
        lines = client.logs(record.id) if explain else []
    if json:
        print_json(job_json(record))
        return
    console.print(job_header(record), highlight=False)
    show(shards_table(record))
    if record.metrics:
        console.print("metrics: " + ", ".join(f"{k} {figure(v)}" for k, v in sorted(record.metrics.items())),
                      highlight=False)
    if explain:
        if record.explanation:
            console.print("[bold]last scheduling round[/] (the plan, each candidate's figures, what waits and why)")
            console.print("  " + record.explanation.replace("\n", "\n  "), highlight=False)
        sizes = sizes_by_device(record)
        if sizes:
            console.print("[bold]shard sizes per device[/] (rows, in the order they were cut; why: each placement)")
            for line in sizes:
                console.print(f"  {line}", highlight=False)
        data = [line.message.removeprefix("data: ") for line in lines if line.message.startswith("data: ")]
        data += read_routes(record)
        if data:
            console.print("[bold]data[/] (how the dataset was planned, where its preprocess runs, and per node which "
                          "way its data came)")
            for line in data:
                console.print(f"  {line}", highlight=False)
        spent = time_by_device(record)
        if spent:
            console.print("[bold]time in shards[/] (per device: the parts of their measured windows, the rest the "
                          "model's, and what came before them on the node)")
            for line in spent:
                console.print(f"  {line}", highlight=False)
        tuned = [line.message.removeprefix("tuning: ") for line in lines if line.message.startswith("tuning: ")]
        if tuned:
            console.print("[bold]tuning[/] (per node and device: whether it tuned and why, the winner and its cost; "
                          "the A/B of the winner against eager in this job's own shards)")
            for line in tuned:
                console.print(f"  {line}", highlight=False)
        console.print("[bold]placements[/] (each shard, where it went and the score it went on)")
        for line in lines:
            if "→" in line.message:
                console.print(f"  {line.message}", highlight=False)


def retry_line(job: job_pb2.Job) -> str:
    """What a retry runs again, in one line."""
    again = [s for s in job.shards if s.state != "succeeded"]
    shards = f"shards {', '.join(str(s.index) for s in again)} ({count(sum(s.stop - s.start for s in again))} rows)"
    return f"{job.id} {job.state} (run {job.run}): {shards if again else 'its uncut rows'} run again"


def logs(
    job_id: JobId,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")
                       ] = False,
    shard: Annotated[int | None, typer.Option("--shard", help="Only this shard's lines: placements, output, errors.")
                     ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Tracebacks with Farm's own frames as well.")
                       ] = False,
    json: Json = False,
    head: Head = None,
    token: Token = None,
    ca: Ca = None,
    token_file: TokenFile = None,
) -> None:
    """Print a job's log: its events, and what each shard printed (stdout, stderr, tracebacks)."""
    with connect(head, token, ca, token_file) as client:
        job_id = client.resolve_job(job_id)
        if shard is not None:
            _check_shard(client.job(job_id), shard, follow_)
        if not follow_:
            lines = [line for line in client.logs(job_id, shard) if verbose or line.level != VERBOSE]
            if json:
                print_json([log_line_json(line) for line in lines])
            else:
                for line in lines:
                    print_log_line(line)
            return
        seen = 0
        try:  # one JSON object a line with --json: a stream
            # Late binding on purpose: a reconnect resumes after the last line seen.
            for line in through_restarts(lambda: client.follow_logs(job_id, shard, after=seen),  # noqa: B023
                                         RECONNECT_S, head_gone):
                seen = line.id
                if verbose or line.level != VERBOSE:
                    print_json(log_line_json(line), indent=None) if json else print_log_line(line)
        except KeyboardInterrupt:
            detach(client, job_id)


def _check_shard(record: job_pb2.Job, shard: int, following: bool) -> None:
    """A --shard the job has, or one line saying which it has. A running job that cuts its shards as it runs may
    make that shard later: following it, wait for it."""
    if any(s.index == shard for s in record.shards) or (following and not JobState(record.state).finished):
        return
    indexes = sorted(s.index for s in record.shards)
    has = f"shards {indexes[0]}-{indexes[-1]}" if indexes else "no shards yet"
    raise UserError(f"--shard {shard}: job {record.id} has no shard {shard} ({has})")


def cancel(job_id: JobId, json: Json = False, head: Head = None, token: Token = None, ca: Ca = None,
           token_file: TokenFile = None) -> None:
    """Cancel a queued or running job."""
    with connect(head, token, ca, token_file) as client:
        record = client.cancel(client.resolve_job(job_id))
    print_json(job_json(record)) if json else console.print(f"{record.id} {record.state}")
