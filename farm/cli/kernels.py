"""`farm kernels eval|tune|results|propose`: candidates measured by the hardened evaluator, here or on the fleet."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from farm.cli.options import Ca, Head, Json, Token, TokenFile, connect
from farm.cli.render import console, print_json, print_whole
from farm.core.errors import NotFoundError, UserError

if TYPE_CHECKING:
    from farm.core.kernels import KernelResult
    from farm_agent.tuner.evaluator import Result

app = typer.Typer(help="Measure and tune implementations of models on this machine's devices.",
                  no_args_is_help=True)


@app.command("eval")
def eval_command(
    problem: Annotated[Path, typer.Argument(help="A problem file: class Model, get_inputs(), get_init_inputs().")],
    candidate: Annotated[
        list[Path] | None,
        typer.Option("--candidate", help="A candidate file defining class ModelNew (repeatable).", show_default=False),
    ] = None,
    device: Annotated[str | None, typer.Option(help="cuda, cuda:N or cpu (default: cuda when there is a GPU).")] = None,
    atol: Annotated[float, typer.Option(help="Absolute tolerance against the eager fp32 reference.")] = 1e-4,
    rtol: Annotated[
        float, typer.Option(help="Relative tolerance; the relative norm error must also be within max(atol, rtol).")
    ] = 1e-4,
    runs: Annotated[int, typer.Option(help="Timed runs per candidate (the median is reported).")] = 20,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="Per candidate, compile included.")] = 600.0,
    json: Json = False,
) -> None:
    """Evaluate eager, torch.compile (default mode) and the given candidates: correctness, median time, speedups."""
    # What can be checked without torch is checked first: importing it takes seconds.
    if device is not None and not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise UserError(f"--device {device}: use cuda, cuda:N or cpu")
    for path, what in [(problem, "problem"), *((c, "candidate") for c in candidate or [])]:
        if not path.is_file():
            raise NotFoundError(f"{what} file {path} not found")
    from farm_agent.tuner.evaluator import COMPILE_DEFAULT, cuda_available, evaluate, file_candidate  # imports torch

    if device is None:
        device = "cuda" if cuda_available() else "cpu"
    candidates = [COMPILE_DEFAULT, *(file_candidate(path) for path in candidate or [])]
    results = evaluate(problem, candidates, device=device, atol=atol, rtol=rtol, runs=runs, timeout_s=timeout_s)
    rows = [row(r, results) for r in results]
    if json:
        print_json({"problem": str(problem), "device": device, "atol": atol, "rtol": rtol, "results": rows})
    else:
        print_whole(results_table(f"{results[0].problem} on {device} (atol {atol:g}, rtol {rtol:g})", rows))


def row(result: Result, results: list[Result]) -> dict[str, Any]:
    """A result with its speedups against eager and compile-default (None where either side is not a correct time)."""
    by_name = {r.candidate: r for r in results}
    data = result.to_dict()
    for baseline in ("eager", "compile-default"):
        base = by_name.get(baseline)
        fast = base is not None and base.correct and result.correct and base.median_ms and result.median_ms
        data[f"speedup_vs_{baseline.replace('-', '_')}"] = (
            base.median_ms / result.median_ms if fast else None  # type: ignore[union-attr,operator]
        )
    sol = result.speed_of_light()
    data["sol_share"] = sol.share(result.median_ms) if sol is not None and result.correct else None
    data["sol_bound"] = sol.bound if sol is not None else ""
    data["sol_peaks"] = sol.peaks.describe() if sol is not None else ""
    return data


def results_table(title: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("CANDIDATE", "COMPILED", "CORRECT", "MAX ERR", "REL NORM ERR", "MEDIAN MS", "VS EAGER",
                   "VS COMPILE", "OF SOL", "NOTE"):
        table.add_column(column, justify="right" if column not in ("CANDIDATE", "NOTE") else "left")
    for r in rows:
        table.add_row(
            r["candidate"] + (" (lower precision)" if r["lowers_precision"] else ""),
            yes_no(r["compiled"]), yes_no(r["correct"]), number(r["max_abs_err"]), number(r["rel_norm_err"]),
            f"{r['median_ms']:.4f}" if r["median_ms"] is not None else "-",
            speedup(r["speedup_vs_eager"]), speedup(r["speedup_vs_compile_default"]),
            sol_share(r.get("sol_share"), r.get("sol_bound", "")), r["error"],
        )
    peaks = sorted({r["sol_peaks"] for r in rows if r.get("sol_peaks")})
    if peaks:
        table.caption = sol_caption(peaks)
    return table


def sol_share(share: float | None, bound: str) -> str:
    """A share of the speed of light with the bound that set it: "41% mem"."""
    return "-" if share is None else f"{share:.0%} {'mem' if bound == 'memory' else 'flop'}"


def sol_caption(peaks: list[str]) -> str:
    return ("OF SOL: the speed of light (max of FLOPs at the fp32 peak, bytes at the memory bandwidth; mem/flop: "
            "which bound) over the median; peaks " + "; ".join(peaks))


def yes_no(value: bool) -> str:
    return "[green]yes[/]" if value else "[red]no[/]"


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


@app.command("tune")
def tune_command(
    problem: Annotated[Path, typer.Argument(help="A problem file, or a folder of them (each tuned in turn).")],
    budget_s: Annotated[
        float, typer.Option("--budget-s", help="Search seconds per problem (compiling counts).")
    ] = 120.0,
    device: Annotated[str | None, typer.Option(help="cuda, cuda:N or cpu (default: cuda when there is a GPU).")] = None,
    atol: Annotated[float, typer.Option(help="Absolute tolerance: precision is lowered only when it allows.")] = 1e-4,
    rtol: Annotated[float, typer.Option(help="Relative tolerance (also the bound on the relative norm error).")] = 1e-4,
    runs: Annotated[int, typer.Option(help="Timed runs per candidate (the median is reported).")] = 20,
    p: Annotated[float, typer.Option("--p", help="fast_p: faster than compile-default by more than this.")] = 0.05,
    json: Json = False,
) -> None:
    """Search each problem's candidates in the learnt policy's order within the budget; the fastest correct one wins
    and is cached for this GPU (the CUDA backend runs it). Prints the winner, its speedups and trials per problem,
    then fast_p and the geometric-mean speedups."""
    from dataclasses import asdict

    if device is not None and not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise UserError(f"--device {device}: use cuda, cuda:N or cpu")
    from farm_agent.tuner.evaluator import cuda_available  # imports torch
    from farm_agent.tuner.problem import problem_paths
    from farm_agent.tuner.tune import summarize, table_row, tune

    device = device or ("cuda" if cuda_available() else "cpu")
    reports = [tune(path, budget_s=budget_s, atol=atol, rtol=rtol, device=device, runs=runs)
               for path in problem_paths(problem)]
    summary = summarize(reports, "run", p)
    if json:
        print_json({"device": device, "atol": atol, "rtol": rtol, "budget_s": budget_s,
                    "reports": [r.to_json() for r in reports], "summary": asdict(summary)})
        return
    table = Table(title=f"tuned on {device} (atol {atol:g}, rtol {rtol:g}, budget {budget_s:g} s per problem)",
                  title_justify="left")
    for column in ("PROBLEM", "WINNER", "MS", "VS EAGER", "VS COMPILE", "OF SOL", "TRIALS", "STOPPED"):
        table.add_column(column, justify="left" if column in ("PROBLEM", "WINNER", "STOPPED") else "right")
    for report in reports:
        r = table_row(report)
        winner = (r["winner"] or "none correct") + (" (lower precision)" if r["lowers_precision"] else "")
        table.add_row(r["problem"], winner, f"{r['winner_ms']:.4f}" if r["winner_ms"] else "-",
                      speedup(r["vs_eager"]), speedup(r["vs_compile"]), sol_share(r["sol_share"], r["sol_bound"]),
                      str(r["trials"]), report.stop_reason)
    peaks = sorted({sol.peaks.describe() for report in reports if (sol := report.speed_of_light()) is not None})
    if peaks:
        table.caption = sol_caption(peaks)
    print_whole(table)
    share = f"; geomean {summary.geomean_sol_share:.0%} of the speed of light" \
        if summary.geomean_sol_share is not None else ""
    console.print(f"fast_{p:g}: {summary.fast_p:.0%} of {summary.problems} (correct and more than {p:.0%} faster than "
                  f"compile-default); geomean {speedup(summary.geomean_vs_eager)} vs eager, "
                  f"{speedup(summary.geomean_vs_compile)} vs compile{share}")


@app.command("results")
def results_command(
    job_id: Annotated[str, typer.Argument(help="A finished kernel-eval job's id (j-...).")],
    json: Json = False,
    head: Head = None,
    token: Token = None,
    ca: Ca = None,
    token_file: TokenFile = None,
) -> None:
    """A kernel-eval job's results table: per (problem, candidate) compiled, correct, errors, time, speedups, reward.
    Read from the job's output folder on the head's machine (results.jsonl; results.csv beside it)."""
    from farm.client.kernels import read_results

    with connect(head, token, ca, token_file) as client:
        job = client.job(client.resolve_job(job_id))
    job_id = job.id
    if job.kind != "kernel-eval":
        raise UserError(f"job {job_id} is a {job.kind} job, not kernel-eval")
    if job.state != "succeeded":
        raise UserError(f"job {job_id} is {job.state}: no results table" + (f" ({job.error})" if job.error else ""))
    rows = read_results(job.output)
    if json:
        print_json({"job_id": job_id, "output": job.output, "results": [r.to_dict() for r in rows]})
    else:
        print_whole(kernel_results_table(f"{job.name} ({job_id}): {job.output}/results.csv", rows))


def kernel_results_table(title: str, rows: list[KernelResult]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("PROBLEM", "CANDIDATE", "NODE", "COMPILED", "CORRECT", "MAX ERR", "MEDIAN MS", "VS EAGER",
                   "VS COMPILE", "OF SOL", "REWARD", "NOTE"):
        table.add_column(column, justify="left" if column in ("PROBLEM", "CANDIDATE", "NODE", "NOTE") else "right")
    for r in rows:
        table.add_row(
            r.problem, r.candidate + (" (lower precision)" if r.lowers_precision else ""),
            f"{r.node} {r.device}".strip(), yes_no(r.compiled), yes_no(r.correct), number(r.max_abs_err),
            f"{r.median_ms:.4f}" if r.median_ms is not None else "-", speedup(r.speedup_vs_eager),
            speedup(r.speedup_vs_compile), sol_share(r.sol_share, r.sol_bound), f"{r.reward:g}", r.error,
        )
    peaks = sorted({r.sol_peaks for r in rows if r.sol_peaks})
    if peaks:
        table.caption = sol_caption(peaks)
    return table


@app.command("propose")
def propose_command(
    problem: Annotated[Path, typer.Argument(help="A problem file: class Model, get_inputs(), get_init_inputs().")],
    endpoint: Annotated[str, typer.Option(help="An OpenAI-compatible API's base URL, e.g. https://host/v1.")],
    model: Annotated[str, typer.Option(help="The code model's name at that endpoint.")],
    rounds: Annotated[int, typer.Option(help="Proposals asked for, each told how the earlier ones did.")] = 3,
    api_key_env: Annotated[
        str, typer.Option("--api-key-env", help="The environment variable holding the endpoint's key.")
    ] = "OPENAI_API_KEY",
    fleet: Annotated[bool, typer.Option("--fleet", help="Evaluate on the farm (a kernel-eval job per round).")] = False,
    backend: Annotated[str, typer.Option(help="--fleet: the backend to evaluate on (cuda or cpu).")] = "cuda",
    device: Annotated[str | None, typer.Option(help="Here: cuda, cuda:N or cpu (default: cuda when there is one).")
                      ] = None,
    runs: Annotated[int, typer.Option(help="Timed runs per candidate (the median is reported).")] = 20,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="Per candidate, compile included.")] = 60.0,
    compile_baseline: Annotated[
        bool, typer.Option("--compile/--no-compile", help="Here: time torch.compile as a baseline too.")
    ] = True,
    json: Json = False,
    head: Head = None,
    token: Token = None,
    ca: Ca = None,
    token_file: TokenFile = None,
) -> None:
    """Ask an external code model for faster implementations, round after round, each judged by the hardened
    evaluator and fed back to it; the fastest correct one wins (kept in the winner cache when evaluated here)."""
    from farm.client.proposer import Endpoint, fleet_evaluator, propose
    from farm_agent.work.local_eval import local_evaluator, local_winner_cache

    if not problem.is_file():
        raise NotFoundError(f"problem file {problem} not found")
    if rounds < 1:
        raise UserError("--rounds must be at least 1")
    if not endpoint.startswith(("http://", "https://")):
        raise UserError(f"--endpoint {endpoint}: give an http(s) URL")
    chat = Endpoint(url=endpoint, model=model, api_key_env=api_key_env)
    if fleet:
        if backend not in ("cuda", "cpu"):
            raise UserError(f"--backend {backend}: use cuda or cpu")
        with connect(head, token, ca, token_file) as client:
            offers = {o.detail or o.device
                      for n in client.nodes() for o in n.backends if o.name == backend and o.available}
            hardware = ", ".join(sorted(offers)) or backend
            proposal = propose(problem, chat, fleet_evaluator(client, backends=[backend], runs=runs,
                                                              timeout_s=timeout_s), rounds=rounds, hardware=hardware)
    else:
        if device is not None and not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
            raise UserError(f"--device {device}: use cuda, cuda:N or cpu")
        from farm_agent.tuner.cache import device_identity
        from farm_agent.tuner.evaluator import cuda_available  # imports torch

        device = device or ("cuda" if cuda_available() else "cpu")
        evaluate = local_evaluator(device, runs=runs, timeout_s=timeout_s, compile_baseline=compile_baseline)
        proposal = propose(problem, chat, evaluate, rounds=rounds,
                           hardware=device_identity(device)[0], remember=local_winner_cache(device))
    if json:
        print_json(proposal.to_json())
        return
    rows = [r.result for r in proposal.rounds if r.result is not None]
    print_whole(kernel_results_table(f"{proposal.problem}: {rounds} rounds on {proposal.hardware}", rows))
    for r in proposal.rounds:
        if r.code is None:
            console.print(f"round {r.number}: no code block in the reply")
    if proposal.winner is None:
        console.print("no correct proposal")
    else:
        console.print(f"winner: round {proposal.winner.number}" +
                      (f", cached at {proposal.cache_path}" if proposal.cache_path else ""))
