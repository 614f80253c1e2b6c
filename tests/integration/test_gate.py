"""The gate (farm.head.gate): an unauthenticated call is refused from its metadata, before the head reads its body.
The head runs in a process of its own here, so that its memory is its own to measure."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import psutil
import pytest

from farm.proto.v1 import job_pb2, job_pb2_grpc
from tests.conftest import ROOT

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
