"""The CLI from a user's own machine against a head elsewhere (a real gRPC head in this test process, without Ray,
so jobs stay queued until a test ends them): profiles, FARM_HEAD, re-attaching, following logs, Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.local import wait_for
from tests.conftest import FIXTURES, ROOT, farm
from tests.integration.inprocess_head import Head, running_head

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    with running_head(tmp_path_factory.mktemp("remote-head")) as running:
        yield running


@pytest.fixture()
def user(tmp_path: Path, head: Head) -> dict[str, str]:
    """A user's machine: no local head, its own config file, the head's token and CA in files of its own."""
    (tmp_path / "lab.token").write_text(head.tokens.api + "\n")
    (tmp_path / "lab-ca.pem").write_bytes(head.ca_pem)
    return {"FARM_CONFIG": str(tmp_path / "config.toml"), "FARM_STATE_DIR": str(tmp_path / "no-head"),
            "HOME": str(tmp_path)}


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    shutil.copy(FIXTURES / "jobs" / "toyjob.py", folder / "toyjob.py")
    (folder / "job.yaml").write_text("name: toy\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nshards: 2\n")
    return folder


def add_lab(user: dict[str, str], head: Head, tmp_path: Path) -> None:
    added = farm("profile", "add", "lab", "--head", head.settings.address, "--token-file",
                 str(tmp_path / "lab.token"), "--ca-file", str(tmp_path / "lab-ca.pem"), "--default", env=user)
    assert added.returncode == 0, added.stderr


def test_a_profile_names_a_head_and_its_credentials_files(user: dict[str, str], head: Head, tmp_path: Path) -> None:
    assert farm("jobs", env=user).returncode == 2  # no head here, no profile yet
    add_lab(user, head, tmp_path)
    config = Path(user["FARM_CONFIG"])
    assert oct(config.stat().st_mode & 0o777) == "0o600" and head.tokens.api not in config.read_text()
    listed = json.loads(farm("profile", "list", "--json", env=user).stdout)
    assert [(p["name"], p["default"], p["address"]) for p in listed] == [("lab", True, head.settings.address)]
    for argv in (("jobs", "--json"), ("--profile", "lab", "jobs", "--json"), ("-p", "lab", "nodes", "--json")):
        result = farm(*argv, env=user)
        assert result.returncode == 0, result.stderr
        assert isinstance(json.loads(result.stdout), list)
    unknown = farm("--profile", "nope", "jobs", env=user)
    assert unknown.returncode == 2 and "no profile 'nope'" in unknown.stderr and "lab" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1


def test_farm_head_and_farm_token_reach_a_head_without_a_profile(user: dict[str, str], head: Head,
                                                                  tmp_path: Path) -> None:
    env = {**user, "FARM_HEAD": head.settings.address, "FARM_TOKEN_FILE": str(tmp_path / "lab.token"),
           "FARM_CA": str(tmp_path / "lab-ca.pem")}
    result = farm("jobs", "--json", env=env)
    assert result.returncode == 0, result.stderr
    wrong = farm("jobs", env={**env, "FARM_TOKEN_FILE": "", "FARM_TOKEN": "forged"})
    assert wrong.returncode == 2 and "invalid or missing API token" in wrong.stderr


def test_version_and_shell_completion(user: dict[str, str], head: Head, tmp_path: Path) -> None:
    version = farm("--version", env=user)
    assert version.returncode == 0 and version.stdout.strip().startswith("farm 0.")
    # From bash, as a user types it: typer finds the shell among the command's parents (a suite started with no
    # shell above it, as under setsid, has none of its own to find).
    command = f"'{sys.executable}' -m farm.cli.main --show-completion; exit $?"  # `; exit`: bash does not exec it
    script = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, **user, "SHELL": "/bin/bash"})
    assert script.returncode == 0 and "complete -o default -F _farm_completion farm" in script.stdout, script.stderr
    add_lab(user, head, tmp_path)
    for words, expected in (("farm lo", ["logs"]), ("farm --profile ", ["lab", "local"])):
        completed = farm(env={**user, "_FARM_COMPLETE": "complete_bash", "COMP_WORDS": words,
                              "COMP_CWORD": str(len(words.split(" ")) - 1)})
        assert completed.stdout.split() == expected, completed.stderr


def test_ctrl_c_on_submit_wait_leaves_the_job_running_and_says_how_to_come_back(
        user: dict[str, str], head: Head, tmp_path: Path, work: Path) -> None:
    add_lab(user, head, tmp_path)
    with head.client() as client:
        before = {j.id for j in client.list_jobs()}
    # SIGINT as a terminal's Ctrl-C finds it: a suite run in the background (`cmd &` in a script) ignores SIGINT,
    # the child would inherit that, and Python then installs no KeyboardInterrupt handler (the CLI never sees it).
    # The child installs the handler itself: a `preexec_fn` makes subprocess fork() this process, whose gRPC threads
    # can leave a lock held in the child, which then hangs before exec (CI saw the submit never arrive).
    interruptible = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                     "sys.argv[0] = 'farm'; runpy.run_module('farm.cli.main', run_name='__main__')")
    waiting = subprocess.Popen(
        [sys.executable, "-c", interruptible, "submit", "job.yaml", "--wait", "--no-check"], cwd=work,
        env={**os.environ, **user}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with head.client() as client:
        if not wait_for(lambda: any(j.id not in before for j in client.list_jobs()), 60):
            waiting.kill()
            pytest.fail(f"the submit never reached the head: {waiting.communicate()}")
        (job_id,) = [j.id for j in client.list_jobs() if j.id not in before]
        # Into the watch (the job is in the store before submit returns: a signal then would come mid-submit).
        assert head.events is not None and wait_for(lambda: head.on_loop(lambda: head.events.watched(job_id)), 30)
        waiting.send_signal(signal.SIGINT)
        _, err = waiting.communicate(timeout=30)
        assert waiting.returncode == 130, err
        assert f"job {job_id} keeps running" in err
        assert f"farm --profile lab job {job_id} --wait" in err and f"farm --profile lab logs {job_id} --follow" in err
        assert "Traceback" not in err
        assert client.job(job_id).state == "queued"  # left running

        # Re-attach, as the message said: both end when the job does.
        env = {**os.environ, **user}
        reattached = subprocess.Popen([sys.executable, "-m", "farm.cli.main", "--profile", "lab", "job", job_id,
                                       "--wait"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        following = subprocess.Popen([sys.executable, "-m", "farm.cli.main", "--profile", "lab", "logs", job_id,
                                      "--follow"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)  # both are waiting on the head
        assert reattached.poll() is None and following.poll() is None
        client.cancel(job_id)
        out, err = reattached.communicate(timeout=30)
        assert reattached.returncode == 1 and "cancelled" in out, err  # not succeeded: exit 1, as submit --wait
        out, err = following.communicate(timeout=30)
        assert following.returncode == 0, err
        lines = out.strip().splitlines()
        assert "accepted: 32 items in 2 shards" in lines[0] and lines[-1].endswith("job cancelled")


def test_wait_and_follow_carry_on_when_the_head_restarts(tmp_path: Path) -> None:
    """A head that goes away (a crash, an upgrade) and comes back on its address: `farm job ID --wait` and
    `farm logs ID --follow` wait for it and carry on where they were, rather than fail."""
    from tests.integration.test_output_folder import SPEC, code

    state = tmp_path / "state"
    with running_head(state) as first:
        (tmp_path / "token").write_text(first.tokens.api)
        (tmp_path / "ca.pem").write_bytes(first.ca_pem)
        env = {**os.environ, "FARM_CONFIG": str(tmp_path / "none.toml"), "FARM_HEAD": first.settings.address,
               "FARM_TOKEN_FILE": str(tmp_path / "token"), "FARM_CA": str(tmp_path / "ca.pem")}
        with first.client() as client:
            job_id = client.submit(SPEC, code(), items=10, output=str(tmp_path / "out"))
        command = [sys.executable, "-m", "farm.cli.main"]
        waiting = subprocess.Popen([*command, "job", job_id, "--wait"], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        following = subprocess.Popen([*command, "logs", job_id, "--follow"], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert "accepted: 10 items in 2 shards" in following.stdout.readline()  # attached
        port, mtls_port = first.settings.port, first.settings.mtls_port
    # The head is gone; it comes back from the same state folder, on the same address.
    with running_head(state, port=port, mtls_port=mtls_port) as second, second.client() as client:
        client.cancel(job_id)
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 1 and "cancelled" in out, err  # the job's end, as if nothing had happened
        assert "the head does not answer; trying again" in err
        out, err = following.communicate(timeout=60)
        assert following.returncode == 0, err
        assert out.strip().splitlines()[-1].endswith("job cancelled")
        assert "accepted:" not in out  # resumed after the lines it had printed, not from the start
