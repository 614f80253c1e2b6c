"""The high-level SDK (farm.Client, farm.sdk) against a real gRPC head without Ray: typed records, specs as files,
YAML text or dicts, paths as str or Path, profiles, re-attaching by id, cancel."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.message import Message

import farm
from farm.core.errors import NotFoundError, SpecError
from tests.conftest import FIXTURES
from tests.integration.inprocess_head import Head, running_head


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    with running_head(tmp_path_factory.mktemp("sdk-head")) as running:
        yield running


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    shutil.copy(FIXTURES / "jobs" / "toyjob.py", tmp_path / "toyjob.py")
    for name in ("toy", "toy2"):
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nmodel: toyjob:doubler\ndataset: toyjob:numbers\n")
    return tmp_path


@pytest.fixture()
def client(head: Head, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[farm.Client]:
    monkeypatch.setenv("FARM_CONFIG", str(tmp_path / "no-config.toml"))
    (tmp_path / "ca.pem").write_bytes(head.ca_pem)
    with farm.Client(head=head.settings.address, token=head.tokens.api, ca=str(tmp_path / "ca.pem")) as connected:
        yield connected


def test_submit_a_spec_in_every_form_and_follow_it_with_typed_records(client: farm.Client, work: Path) -> None:
    jobs = [
        client.submit(work / "toy.yaml", workdir=work),  # a Path
        client.submit(str(work / "toy2.yaml"), workdir=str(work)),  # a str path
        client.submit("name: text\nmodel: toyjob:doubler\ndataset: toyjob:numbers\n", workdir=work),  # YAML text
        client.submit({"name": "fields", "model": "toyjob:doubler", "dataset": "toyjob:numbers", "shards": 4,
                       "output": str(work / "elsewhere")}, workdir=work, check=False),  # a dict
    ]
    infos = [job.info() for job in jobs]
    assert [i.name for i in infos] == ["toy", "toy2", "text", "fields"]
    assert all(isinstance(i, farm.JobInfo) and i.state == "queued" and i.items == 32 for i in infos)
    assert all(isinstance(s, farm.ShardInfo) for s in infos[3].shards) and len(infos[3].shards) == 4
    assert infos[3].output == str(work / "elsewhere") and infos[2].output == str(work / "out" / "text")
    assert not any(isinstance(value, Message) for value in infos[0].model_dump().values())

    job = jobs[3]
    lines = job.logs()
    assert isinstance(lines[0], farm.LogLine) and lines[0].message == "accepted: 32 items in 4 shards"
    assert lines[0].shard is None
    again = client.job(job.id)  # re-attach by id, as another program would
    assert again.info().id == job.id
    assert job.cancel().state == "cancelled"
    final = again.wait(timeout=30)
    assert final.state == "cancelled" and final.finished
    assert [line.message for line in again.follow_logs()][-1] == "job cancelled"
    assert client.jobs()[0].id in {j.id for j in jobs}
    for other in jobs[:3]:
        other.cancel()


def test_wait_with_a_timeout_leaves_the_job_running(client: farm.Client, work: Path) -> None:
    job = client.submit(work / "toy.yaml", workdir=work)
    with pytest.raises(TimeoutError, match=f"job {job.id} is still queued"):
        job.wait(timeout=0.1)
    assert job.info().state == "queued"
    job.cancel()


def test_profiles_and_clear_errors(head: Head, tmp_path: Path, work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_CONFIG", str(tmp_path / "config.toml"))
    (tmp_path / "token").write_text(head.tokens.api)
    (tmp_path / "ca.pem").write_bytes(head.ca_pem)
    from farm.client.config import Profile, save_profile

    save_profile("lab", Profile(address=head.settings.address, token_file=tmp_path / "token",
                                ca_file=tmp_path / "ca.pem"), make_default=True)
    with farm.Client(profile="lab") as client, farm.Client() as by_default:  # the file's default: lab
        assert client.address == by_default.address == head.settings.address
        with pytest.raises(NotFoundError):
            client.job("j-nope")
        with pytest.raises(SpecError, match="no such file"):
            client.submit("missing.yaml", workdir=work)
        with pytest.raises(SpecError, match="unknown field 'shardz'"):
            client.submit({"name": "x", "model": "toyjob:doubler", "dataset": "toyjob:numbers", "shardz": 2},
                          workdir=work)
