"""The agent daemon's idle footprint: resident memory and CPU while it only heartbeats.

    python benchmarks/agent_footprint.py [--seconds 60] [--settle 5]

Starts a head and ONE agent (`--detach`) on 127.0.0.1, waits until the agent's node is ready, then samples every
second for --seconds:
  - the agent daemon process alone (its pid from STATE/agents/NAME/agent.json): RSS, and CPU as % of one core from
    cpu_times deltas (user + system) over wall-time deltas;
  - the agent's Ray worker node, counted separately: every process whose session is the `ray start` session
    (os.getsid(p) == agent.json's ray_pid), RSS summed, CPU from per-process cpu_times deltas summed.
Targets: the daemon, idle, under 60 MB resident and under 0.5% of one core. Stops everything it started.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import psutil
from rich.console import Console
from rich.table import Table


from localfarm import LocalFarm, report_cleanup  # noqa: E402  (benchmarks/ is the script's path)

RSS_TARGET_MB = 60.0
CPU_TARGET_PCT = 0.5


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _session_members(leader: int) -> dict[int, psutil.Process]:
    members = {}
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == leader:
                members[proc.pid] = proc
        except OSError:
            continue
    return members


def sample(daemon_pid: int, ray_pid: int, seconds: int) -> dict[str, list[float]]:
    daemon = psutil.Process(daemon_pid)
    series: dict[str, list[float]] = {"daemon_rss": [], "daemon_cpu": [], "ray_rss": [], "ray_cpu": [], "ray_n": []}
    last_wall = time.monotonic()
    last_daemon = _cpu_seconds(daemon)
    members = _session_members(ray_pid)
    last_ray: dict[int, float] = {}
    for pid, proc in members.items():
        try:
            last_ray[pid] = _cpu_seconds(proc)
        except psutil.Error:
            pass
    first_wall, first_daemon = last_wall, last_daemon
    for _ in range(seconds):
        time.sleep(1.0)
        now = time.monotonic()
        wall = now - last_wall
        cpu = _cpu_seconds(daemon)
        series["daemon_cpu"].append(100.0 * (cpu - last_daemon) / wall)
        series["daemon_rss"].append(daemon.memory_info().rss / 2**20)
        last_daemon, last_wall = cpu, now
        # The Ray node: per-process deltas (a process new since the last sample counts from its own start).
        rss, used, seen = 0.0, 0.0, {}
        for pid, proc in _session_members(ray_pid).items():
            try:
                cpu_s = _cpu_seconds(proc)
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
            used += cpu_s - last_ray.get(pid, 0.0)
            seen[pid] = cpu_s
        last_ray = seen
        series["ray_rss"].append(rss / 2**20)
        series["ray_cpu"].append(100.0 * used / wall)
        series["ray_n"].append(float(len(seen)))
    span = last_wall - first_wall
    # Whole-window CPU: cpu_times tick at 10 ms, so a one-second sample reads 0% or 1%; the window mean is exact.
    series["daemon_cpu_mean"] = [100.0 * (last_daemon - first_daemon) / span]
    series["daemon_rss_mean"] = [statistics.fmean(series["daemon_rss"])]
    series["ray_rss_mean"] = [statistics.fmean(series["ray_rss"])]
    series["ray_cpu_mean"] = [statistics.fmean(series["ray_cpu"])]
    return series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=60, help="idle seconds to sample (one sample a second)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to wait after the node is ready")
    args = parser.parse_args()
    console = Console(width=130)
    farms: list[LocalFarm] = []
    with console.status("starting a head and one agent..."):
        farm = LocalFarm(agents=1, cpus=1)
        farms.append(farm)
        farm.__enter__()
    try:
        status = farm.agent_status()[0]
        daemon_pid, ray_pid = int(status["pid"]), int(status["ray_pid"])
        time.sleep(args.settle)
        with console.status(f"sampling the idle agent (pid {daemon_pid}) for {args.seconds} s..."):
            series = sample(daemon_pid, ray_pid, args.seconds)
    finally:
        with console.status("stopping the agent and the head..."):
            farm.stop()

    def row(label: str, key: str, unit: str, target: float | None, judge: str = "median") -> list[str]:
        values = series[key]
        med, top, mean = statistics.median(values), max(values), series[f"{key}_mean"][0]
        cells = [label, f"{med:.2f} {unit}", f"{top:.2f} {unit}", f"{mean:.3f} {unit}"]
        if target is None:
            return [*cells, "(not a target)", "-"]
        met = "[green]yes[/]" if (med if judge == "median" else mean) < target else "[red]no[/]"
        return [*cells, f"< {target:g} {unit} ({judge})", met]

    table = Table(title=f"Idle agent footprint: {args.seconds} one-second samples after {args.settle:g} s settling")
    for column in ("metric", "median", "max", "window mean", "target", "met?"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    table.add_row(*row(f"agent daemon RSS (pid {daemon_pid})", "daemon_rss", "MB", RSS_TARGET_MB))
    table.add_row(*row("agent daemon CPU (% of one core)", "daemon_cpu", "%", CPU_TARGET_PCT, judge="mean"))
    nproc = int(statistics.median(series["ray_n"]))
    table.add_row(*row(f"Ray worker node RSS ({nproc} processes, summed)", "ray_rss", "MB", None))
    table.add_row(*row("Ray worker node CPU (% of one core, summed)", "ray_cpu", "%", None))
    console.print(table)
    console.print("RSS in MiB (2^20 bytes), judged on the median. CPU from cpu_times (user + system), which tick at "
                  "10 ms: a one-second sample reads in steps of 1%, so CPU is judged on the whole window's mean.")
    report_cleanup(console, farms)


if __name__ == "__main__":
    main()
