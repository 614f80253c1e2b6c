from __future__ import annotations

import subprocess
import sys
import time

import psutil

from farm_agent.daemon.idle import OWNER_SIGNALS_EVERY, WINDOW, IdlePolicy, MachineCpu, farm_cpu_percent


def policy(machine: list[float], farm: list[float], limit: float = 90.0) -> IdlePolicy:
    machine_it, farm_it = iter(machine), iter(farm)
    return IdlePolicy(limit, cpu_percent=lambda: next(machine_it), farm_percent=lambda: next(farm_it), cores=4)


def test_the_owner_is_busy_once_their_load_stays_high_over_the_window() -> None:
    idle = policy([95.0] * (WINDOW + 1), [0.0] * (WINDOW + 1))
    verdicts = [idle.busy() for _ in range(WINDOW + 1)]
    assert verdicts[: WINDOW - 1] == [""] * (WINDOW - 1)  # one burst does not flap the node
    assert verdicts[-1] == "owner's CPU load 95% > 90%"
    assert idle.machine_percent == 95.0


def test_farms_own_work_is_not_the_owners_load() -> None:
    # The machine is 95 % busy, but 3.6 of its 4 cores (360 % of one core) are Farm's shards.
    idle = policy([95.0] * WINDOW, [360.0] * WINDOW)
    assert [idle.busy() for _ in range(WINDOW)][-1] == ""


def test_each_beat_reports_farms_share_of_the_machine_beside_the_machines() -> None:
    """The dashboard splits a node's utilisation into the owner's and Farm's: Farm's share is reported whatever the
    idle rule (100: off, as for agents sharing a host), as a share of the whole machine, never above it."""
    for limit in (90.0, 100.0):
        idle = policy([80.0, 30.0], [120.0, 400.0], limit)  # 1.2 of 4 cores; then all 4, in a 30 % reading
        idle.busy()
        assert (idle.machine_percent, idle.farm_percent) == (80.0, 30.0)
        idle.busy()
        assert (idle.machine_percent, idle.farm_percent) == (30.0, 30.0)


def test_a_limit_of_100_turns_the_rule_off() -> None:
    idle = policy([100.0] * WINDOW, [0.0] * WINDOW, limit=100.0)
    assert {idle.busy() for _ in range(WINDOW)} == {""}


def test_farm_cpu_counts_the_processes_under_the_agent() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<5: pass"])
    try:
        known: dict[int, psutil.Process] = {}
        farm_cpu_percent(psutil.Process(), known)  # starts each process's interval
        assert spinner.pid in known
        child = psutil.Process(spinner.pid)
        cpu0, t0 = sum(child.cpu_times()[:2]), time.monotonic()
        time.sleep(1.0)
        reading = farm_cpu_percent(psutil.Process(), known)
        spun = 100 * (sum(child.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        # The child's own CPU over the same second (on a busy machine a spinner gets less than a core): counted.
        assert spun > 5 and reading >= 0.7 * spun
    finally:
        spinner.kill()
        spinner.wait()


def test_the_platforms_owner_signals_join_the_verdict_and_are_read_every_few_beats() -> None:
    reads = []

    def signals() -> str:
        reads.append(1)
        return "on battery (41%)"

    idle = IdlePolicy(100.0, cpu_percent=lambda: 10.0, farm_percent=lambda: 0.0, cores=4, owner_signals=signals)
    assert [idle.busy() for _ in range(OWNER_SIGNALS_EVERY + 1)] == ["on battery (41%)"] * (OWNER_SIGNALS_EVERY + 1)
    assert len(reads) == 2  # beats 0 and OWNER_SIGNALS_EVERY


def test_machine_cpu_is_a_percentage() -> None:
    reading = MachineCpu()
    sum(i * i for i in range(200_000))
    assert 0.0 <= reading() <= 100.0
