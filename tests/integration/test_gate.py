"""The gate (farm.head.gate): an unauthenticated call is refused from its metadata, before the head reads its body.
The head runs in a process of its own here, so that its memory is its own to measure."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import psutil
import pytest

from farm.core.errors import UserError
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc, job_pb2, job_pb2_grpc
from farm_agent.daemon.client import credentials
from tests.conftest import ROOT
from tests.integration.inprocess_head import HW, running_head
from tests.ports import head_ports

MB = 1024 * 1024


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_unauthenticated_calls_do_not_make_the_head_hold_their_bodies(tmp_path: Path) -> None:
    head = subprocess.Popen([sys.executable, "-m", "tests.integration.inprocess_head", str(tmp_path)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(head.stdout.readline())  # type: ignore[union-attr]
        ca = (tmp_path / "tls" / "ca.pem").read_bytes()
        big = job_pb2.SubmitRequest(spec_yaml="name: x", code_zip=b"\0" * (100 * MB))
        options = [("grpc.max_send_message_length", 200 * MB)]
        before = peak_rss_mb(head.pid)

        def submit(_: int) -> grpc.StatusCode:
            with grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(ca), options) as channel:
                try:
                    job_pb2_grpc.JobServiceStub(channel).Submit(big, timeout=60)
                except grpc.RpcError as exc:
                    return exc.code()  # type: ignore[attr-defined,no-any-return]
            return grpc.StatusCode.OK

        with ThreadPoolExecutor(3) as pool:
            codes = list(pool.map(submit, range(3)))
        grown = peak_rss_mb(head.pid) - before
        assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
        assert grown < 50, f"the head's peak memory grew by {grown:.0f} MB for 300 MB of unauthenticated calls"
        assert psutil.Process(head.pid).is_running()
        print(f"the head's peak memory grew by {grown:.0f} MB")
    finally:
        head.stdin.close()  # type: ignore[union-attr]
        head.wait(30)


def zipped(**members: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_a_lender_cannot_send_the_head_a_large_message(tmp_path: Path) -> None:
    """Only a job's code may be large, and it comes in chunks under the API token: a lender's 10 MB Register is
    refused by its size."""
    with running_head(tmp_path) as head, head.channel() as channel:
        huge = agent_pb2.RegisterRequest(join_token=head.tokens.join, name="x" * (10 * MB),
                                         hardware=convert.hardware_to_pb(HW))
        with pytest.raises(grpc.RpcError) as refused:
            agent_pb2_grpc.AgentServiceStub(channel).Register(huge, metadata=credentials(head.tokens.join), timeout=10)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as anonymous:  # nor an upload without the API token
            job_pb2_grpc.JobServiceStub(channel).UploadCode(iter([job_pb2.CodeChunk(data=b"x")]), timeout=10)
        assert anonymous.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_a_job_s_code_above_the_message_limit_goes_in_chunks_and_is_bounded(tmp_path: Path) -> None:
    spec = "name: toy\nmodel: toyjob:doubler\nweights: w.pt\ndataset: toyjob:numbers\nshards: 3\n"
    with running_head(tmp_path / "state", max_code_mb=8) as head, head.client() as client:
        code = zipped(**{"toyjob.py": b"x", "w.pt": os.urandom(6 * MB)})
        job_id = client.submit(spec, code, items=10, output=str(tmp_path / "out"))
        assert (head.settings.state_dir / "jobs" / job_id / "code.zip").read_bytes() == code
        assert list((head.settings.state_dir / "uploads").iterdir()) == []  # taken by the Submit
        with pytest.raises(UserError, match="over 8 MB zipped"):
            client.submit(spec, zipped(**{"toyjob.py": b"x", "w.pt": os.urandom(9 * MB)}), items=10,
                          output=str(tmp_path / "out2"))
        assert list((head.settings.state_dir / "uploads").iterdir()) == []


@pytest.mark.parametrize(("name", "hostname", "refused"), [
    ("x" * MB, "box", "name must be 1 to 64"),  # 4 MiB ones made /api/fleet 8 MiB and the log 8 MB longer
    ("alice\n2026-12-03 INFO farm.head: node bob drained", "box", "name must be 1 to 64 printable"),  # a forged line
    ("alice", "h" * 1000, "hostname must be at most 256"),
])
def test_a_node_s_strings_are_bounded_and_printable(tmp_path: Path, name: str, hostname: str, refused: str) -> None:
    with running_head(tmp_path) as head, head.channel() as channel:
        hardware = convert.hardware_to_pb(HW.model_copy(update={"hostname": hostname}))
        request = agent_pb2.RegisterRequest(join_token=head.tokens.join, name=name, hardware=hardware)
        with pytest.raises(grpc.RpcError) as caught:
            agent_pb2_grpc.AgentServiceStub(channel).Register(request, metadata=credentials(head.tokens.join),
                                                               timeout=10)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert refused in str(caught.value.details())
        with head.client() as client:
            assert client.nodes() == []


def test_a_zip_bomb_is_refused_before_anything_unpacks_it(tmp_path: Path) -> None:
    """A 1.5 MiB zip of a 1.6 GB member took the head to 3.2 GB: what the code unpacks to is bounded first."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("toyjob.py", b"x")
        archive.writestr("w.pt", bytes(64 * MB))  # zeros: deflated to 64 KB
    spec = "name: toy\nmodel: toyjob:doubler\nweights: w.pt\ndataset: toyjob:numbers\nshards: 3\n"
    with running_head(tmp_path / "state", max_unzipped_code_mb=32) as head, head.client() as client:
        assert len(buffer.getvalue()) < MB
        with pytest.raises(UserError, match="unzips to over 32 MB .*'w.pt', to 64 MB"):
            client.submit(spec, buffer.getvalue(), items=10, output=str(tmp_path / "out"))


def test_outputs_stay_out_of_the_state_folder_other_jobs_folders_and_outside_the_root(tmp_path: Path) -> None:
    """A job wrote shards into the head's state folder and over another job's manifest and shards."""
    spec = "name: toy\nmodel: toyjob:doubler\nweights: w.pt\ndataset: toyjob:numbers\nshards: 3\n"
    code = zipped(**{"toyjob.py": b"x", "w.pt": b"w"})
    root = tmp_path / "outputs"
    with running_head(tmp_path / "state", output_root=root) as head, head.client() as client:
        first = client.submit(spec, code, items=10, output=str(root / "a"))
        with pytest.raises(UserError, match=f"where job {first} \\(queued\\) writes"):
            client.submit(spec, code, items=10, output=str(root / "a"))
        with pytest.raises(UserError, match="inside the head's state folder"):
            client.submit(spec, code, items=10, output=str(head.settings.state_dir / "jobs"))
        with pytest.raises(UserError, match="outside the head's output root"):
            client.submit(spec, code, items=10, output=str(tmp_path / "elsewhere"))
        client.submit(spec, code, items=10, output=str(root / "b"))


def test_a_training_spec_cannot_make_the_head_plan_without_end(tmp_path: Path) -> None:
    """100,000 one-step stretches (checkpoint_every: 1 is honest input) were accepted and kept the head at 90 % CPU."""
    spec = ("name: long\nkind: training\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nbatch_size: 1\n"
            "training: {loss: mse, steps: 100000, checkpoint_every: 1}\n")
    with running_head(tmp_path / "state") as head, head.client() as client:
        with pytest.raises(UserError, match="100,000 stretches: at most 10,000"):
            client.submit(spec, zipped(**{"toyjob.py": b"x"}), items=10, output=str(tmp_path / "out"))
        with pytest.raises(UserError, match="epochs"):
            client.submit(spec.replace("steps: 100000", "epochs: 1.0e12"), zipped(**{"toyjob.py": b"x"}),
                          items=10, output=str(tmp_path / "out"))


def test_a_damaged_store_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.db").write_bytes(b"not a database at all" * 100)
    started = subprocess.run([sys.executable, "-m", "farm.cli.main", "head", "start", "--host", "127.0.0.1",
                              *head_ports(), "--state-dir", str(state)],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert started.returncode == 2, started.stderr
    assert started.stderr.strip().count("\n") == 0 and "cannot be read as Farm's store" in started.stderr
