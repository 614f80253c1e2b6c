"""What a newcomer meets in the CLI's first hour (issue 31): help that reads, ids whole and by prefix, one number
format, the head's connection options on every command, profiles that never become the default by themselves, a
detached head that keeps its join token out of its log, clear refusals. The head is a fake client here: these are
the CLI's own behaviours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from farm.cli import head as head_cli
from farm.cli import options
from farm.cli.main import app
from farm.client import Client, HeadInfo, find_head
from farm.client.config import FarmConfig, Profile, save_profile
from farm.core.errors import FarmError, HeadUnavailableError, NotFoundError, UserError
from farm.local import free_port
from farm.proto.v1 import fleet_pb2, job_pb2

ROOT = Path(__file__).resolve().parents[2]
JOB = "j-c06df0aa"
OTHER = "j-c0ffee11"
NODE = "n-5ca1ab1e"


def a_job(job_id: str = JOB, name: str = "digits-infer") -> job_pb2.Job:
    shards = [job_pb2.Shard(index=0, state="succeeded", start=0, stop=184_320, items=184_320, node_name="box",
                            backend="cpu", device="cpu", seconds=4.5),
              job_pb2.Shard(index=1, state="succeeded", start=184_320, stop=200_000, items=15_680, node_name="box",
                            backend="cpu", device="cpu", seconds=0.4)]
    return job_pb2.Job(id=job_id, name=name, kind="inference", state="succeeded", items=200_000, shards=shards,
                       metrics={"items_per_s": 39_540.2, "accuracy": 0.9778}, output="/out/digits")


class FakeClient(Client):
    """The head's side of the calls the commands make; the Client's own logic (prefixes, errors) is the real one."""

    jobs_on_record = [a_job(), a_job(OTHER, "other")]
    node = fleet_pb2.Node(id=NODE, name="box", state="draining", drain=False)

    def __init__(self, head: HeadInfo) -> None:  # no channel
        self.head = head
        self.timeout = 1.0

    def close(self) -> None:
        pass

    def list_jobs(self, limit: int = 100) -> list[job_pb2.Job]:
        return self.jobs_on_record[:limit]

    def job(self, job_id: str) -> job_pb2.Job:
        found = [j for j in self.jobs_on_record if j.id == job_id]
        if not found:
            raise NotFoundError(f"no job {job_id!r}")
        return found[0]

    def logs(self, job_id: str, shard: int | None = None, after: int = 0) -> list[job_pb2.LogLine]:
        return [job_pb2.LogLine(id=1, ts=0.0, level="info", message="accepted", shard=shard)]

    def nodes(self) -> list[fleet_pb2.Node]:
        return [self.node]

    def drain_node(self, node: str, drain: bool = True) -> fleet_pb2.Node:
        assert node in (NODE, "box"), node
        return self.node  # as the head answers an undrain before its next refresh: still `draining`


@pytest.fixture()
def fake_head(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(options, "find_head", lambda *a, **k: HeadInfo(address="127.0.0.1:1", api_token="t", pid=1))
    monkeypatch.setattr(options, "Client", FakeClient)
    monkeypatch.setenv("COLUMNS", "80")  # as in a pipe
    yield


def run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "80", **(env or {})})


# ---- 8. help text, head status, top --json, logs --shard, undrain


def test_help_flows_in_paragraphs_and_flags_show_no_placeholder() -> None:
    every = []
    for argv in ((), ("head", "token"), ("agent",), ("kernels",), ("jobs", "prune"), ("submit",)):
        shown = run(*argv, "--help", env={"COLUMNS": "200"})
        assert shown.exit_code == 0, shown.output
        every.append(shown.output)
    text = "\n".join(every)
    assert "<bool>" not in text
    # Sentences that the docstrings' line ends cut in the middle.
    assert "The Ray token, which every joined machine was given, is replaced too" in text
    assert "Started again (after a stop, a reboot), a node that joined before" in text
    assert "the fastest correct one wins and is cached for this GPU" in text


def test_head_status_says_whether_a_head_runs(tmp_path: Path) -> None:
    shown = run("head", "status", "--state-dir", str(tmp_path))
    assert shown.exit_code == 1 and f"no head running from {tmp_path}" in shown.output
    as_json = run("head", "status", "--state-dir", str(tmp_path), "--json")
    assert json.loads(as_json.stdout) == {"running": False, "state_dir": str(tmp_path)}


def test_top_json_prints_one_frame(fake_head: None) -> None:
    shown = run("top", "--json")
    assert shown.exit_code == 0, shown.output
    frame = json.loads(shown.stdout)
    assert [n["id"] for n in frame["nodes"]] == [NODE] and [j["id"] for j in frame["jobs"]] == [JOB, OTHER]


def test_logs_of_a_shard_the_job_does_not_have_is_refused(fake_head: None) -> None:
    refused = run("logs", JOB, "--shard", "99")
    assert isinstance(refused.exception, UserError) and refused.exception.exit_code == 2  # main(): one line, exit 2
    assert refused.exception.message == f"--shard 99: job {JOB} has no shard 99 (shards 0-1)"
    assert run("logs", JOB, "--shard", "1").exit_code == 0


def test_undrain_does_not_report_draining(fake_head: None) -> None:
    shown = run("undrain", "box")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.strip() == f"node box ({NODE}) undrained: it takes new shards again"


# ---- 6. ids whole and by prefix, one number format


def test_ids_are_printed_whole_in_a_pipe(fake_head: None, monkeypatch: pytest.MonkeyPatch) -> None:
    long_name = "a-job-whose-name-is-long-enough-to-push-the-table-past-eighty-columns"
    monkeypatch.setattr(FakeClient, "jobs_on_record", [a_job(JOB, long_name), a_job(OTHER, "other")])
    for argv in (("jobs",), ("nodes",), ("job", JOB)):
        shown = run(*argv)
        assert shown.exit_code == 0, shown.output
        assert "…" not in shown.stdout, shown.stdout
    assert JOB in run("jobs").stdout and long_name in run("jobs").stdout and NODE in run("nodes").stdout
    assert JOB in run("top", "--once").stdout  # a live view cuts long names (24 characters), never ids


def test_a_unique_prefix_names_a_job_or_node(fake_head: None) -> None:
    for prefix in ("j-c06d", "c06df0"):
        shown = run("job", prefix, "--json")
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["id"] == JOB
    ambiguous = run("job", "j-c0")
    assert isinstance(ambiguous.exception, UserError)
    assert ambiguous.exception.message.startswith("job id 'j-c0' is ambiguous: 2 jobs start so")
    unknown = run("job", "j-ffff")
    assert isinstance(unknown.exception, NotFoundError) and unknown.exception.message == "no job 'j-ffff'"
    assert run("undrain", "n-5ca").exit_code == 0


def test_tables_use_one_number_format(fake_head: None) -> None:
    jobs = run("jobs").stdout
    assert "200,000/200,000" in jobs and "39,540" in jobs
    one = run("job", JOB).stdout
    assert "items_per_s 39,540" in one and "e+0" not in one  # not 3.954e+04
    assert "184,320" in one and "15,680" in one  # shard sizes as every other count


# ---- 7. the head's connection options, TLS trust, --token


def test_every_command_that_takes_head_takes_ca_and_token_file() -> None:
    def commands(group: Any, path: str = "farm") -> Iterator[tuple[str, Any]]:
        yield path, group
        if isinstance(group, TyperGroup):
            for name, sub in group.commands.items():
                yield from commands(sub, f"{path} {name}")

    reaching = [(path, {o for p in c.params for o in p.opts}) for path, c in commands(typer.main.get_command(app))
                if "--head" in {o for p in c.params for o in p.opts} and not path.startswith(("farm agent",
                                                                                             "farm profile"))]
    assert len(reaching) > 10
    assert [path for path, opts in reaching if not {"--ca", "--token-file"} <= opts] == []


def test_token_on_the_command_line_warns(fake_head: None) -> None:
    shown = run("nodes", "--token", "s3cret", "--json")
    assert shown.exit_code == 0
    assert "warning: --token shows in `ps`" in shown.stderr and "s3cret" not in shown.stderr
    assert "warning" not in run("nodes", "--json", env={"FARM_TOKEN": "s3cret"}).stderr


@pytest.fixture()
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """A TLS gRPC server with one CA's certificate; the files of that CA and of another."""
    from farm.tls import HeadTLS

    served = HeadTLS.load_or_create(tmp_path / "served", ["127.0.0.1"])
    HeadTLS.load_or_create(tmp_path / "other", ["127.0.0.1"])
    server = grpc.server(futures.ThreadPoolExecutor(2))
    port = free_port()
    server.add_secure_port(f"127.0.0.1:{port}",
                           grpc.ssl_server_credentials([(served.server_key_pem, served.server_chain_pem)]))
    server.start()
    try:
        yield f"127.0.0.1:{port}", tmp_path / "served" / "ca.pem", tmp_path / "other" / "ca.pem"
    finally:
        server.stop(None)


def test_a_tls_trust_failure_is_one_line_that_says_so(tls_server: tuple[str, Path, Path], tmp_path: Path) -> None:
    address, _, other_ca = tls_server
    (tmp_path / "token").write_text("t")
    (tmp_path / "token").chmod(0o600)  # a private token file: no warning of its mode
    result = subprocess.run([sys.executable, "-m", "farm.cli.main", "nodes", "--head", address, "--ca", str(other_ca),
                             "--token-file", str(tmp_path / "token")], capture_output=True, text=True, timeout=120,
                            cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # no gRPC C++ log lines
    assert result.stderr.startswith("error: TLS trust failure: the head at ") and "--ca" in result.stderr


# ---- 3. profiles


def test_the_first_profile_is_not_the_default_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_CONFIG", str(tmp_path / "config.toml"))
    added = run("profile", "add", "lab", "--head", "lab.example.org:7700")
    assert added.exit_code == 0, added.output
    assert FarmConfig.load().profile is None and "lab" in FarmConfig.load().profiles
    assert run("profile", "add", "big", "--head", "big.example.org:7700", "--default").exit_code == 0
    assert FarmConfig.load().profile == "big"


def test_a_connection_error_names_the_profile_and_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("FARM_CONFIG", str(config))
    (tmp_path / "token").write_text("t")
    (tmp_path / "token").chmod(0o600)
    save_profile("lab", Profile(address=f"127.0.0.1:{free_port()}", token_file=tmp_path / "token", insecure=True))
    with Client(find_head(profile="lab"), timeout=10) as client, pytest.raises(HeadUnavailableError) as refused:
        client.nodes()
    assert refused.value.message.endswith(f"does not answer (profile 'lab' in {config})")


def test_the_tests_read_a_config_of_their_own() -> None:
    # tests/conftest.py: a user's profiles (and FARM_HEAD, FARM_PROFILE, ...) never reach the tests' commands.
    config = Path(os.environ["FARM_CONFIG"])
    assert config != Path.home() / ".config" / "farm" / "config.toml" and not config.exists()
    assert "FARM_PROFILE" not in os.environ and "FARM_HEAD" not in os.environ


# ---- 4. a detached head's join line


def test_a_detached_head_writes_no_join_token_into_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.local import write_json

    class Started:
        pid = 4242

    def started(argv: list[str], log: Path, ready: Any, what: str) -> Started:
        write_json(tmp_path / "head.json", {"pid": 4242, "address": "10.0.0.1:7700", "join_token": "JOIN-S3CRET",
                                            "ca_hash": "sha256:00", "dashboard": "https://10.0.0.1:7702"})
        return Started()

    monkeypatch.setattr(head_cli, "start_in_background", started)
    shown = CliRunner().invoke(head_cli.app, ["start", "--detach", "--state-dir", str(tmp_path)])  # not a terminal
    assert shown.exit_code == 0, shown.output
    assert "JOIN-S3CRET" not in shown.output and "farm head token create" in shown.output


def test_a_detached_start_that_fails_says_its_error_not_the_noise_after_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A library's complaint as the process ended ("Event loop is closed", CI stop 36) came after the reason."""
    said = ("import sys; print('starting'); print('error: cannot listen on port 7702', file=sys.stderr); "
            "print('Traceback (most recent call last):\\nRuntimeError: Event loop is closed', file=sys.stderr); "
            "sys.exit(2)")
    monkeypatch.setattr(options, "python_command", lambda *argv: [sys.executable, "-c", said])
    with pytest.raises(UserError) as failed:
        options.start_in_background(["head", "start", "--detach"], tmp_path / "head.log", lambda: False,
                                    "the head did not start")
    assert failed.value.message.startswith("the head did not start: error: cannot listen on port 7702 (log: ")


# ---- 14. the output folder before the model check


def test_a_used_output_folder_is_refused_before_the_model_check(fake_head: None, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import farm.client.preflight as preflight

    checked: list[str] = []
    monkeypatch.setattr(preflight, "check_job", lambda *a, **k: checked.append("model") or pytest.fail("checked"))
    (tmp_path / "job.yaml").write_text("name: x\nmodel: toyjob:doubler\ndataset: toyjob:numbers\noutput: out\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "shard-00000.parquet").write_bytes(b"PAR1")
    refused = run("submit", str(tmp_path / "job.yaml"), "--workdir", str(tmp_path))
    assert isinstance(refused.exception, FarmError) and refused.exception.exit_code == 2
    assert "already holds another job's results" in refused.exception.message and checked == []


# ---- 2. README


def test_readme_says_how_to_get_the_browser_the_dashboard_test_needs() -> None:
    first_screen = (ROOT / "README.md").read_text().split("## Using it")[0]
    assert "chromium" in first_screen and "apt-get install -y chromium" in first_screen
