"""Finding 3: DataService calls were let through the gate with any bearer (`Bearer x`), so the head read every such
call's body (up to 4 MiB each: 1,000 of them took a head to 1.22 GB) before it checked the credential. Now the gate
checks it from the call's metadata, before gRPC reads the body."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from farm.core.dataset import DatasetSpec
from farm.head import datasets
from farm.head.store import Store
from farm.local import write_private
from farm.proto.v1 import data_pb2, data_pb2_grpc
from tests.integration.inprocess_head import Head, running_head


@pytest.fixture()
def head(tmp_path: Path):  # type: ignore[no-untyped-def]
    with running_head(tmp_path / "state") as head:
        yield head


def read(head: Head, bearer: str, path: str) -> grpc.RpcError:
    """A Read whose body is `path` (large: gRPC takes no message over 4 MiB); the error it gets."""
    with head.channel() as channel:
        stub = data_pb2_grpc.DataServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            list(stub.Read(data_pb2.ReadRequest(job_id="j-1", path=path, offset=0, length=1),
                           metadata=(("authorization", f"Bearer {bearer}"),), timeout=10))
        return failed.value


def test_any_bearer_is_refused_before_the_body_is_read(head: Head) -> None:
    # Refused from its metadata, the 5 MB body is never read (had it been, gRPC would refuse it as too large).
    error = read(head, "x", "p" * (5 * 1024 * 1024))
    assert error.code() is grpc.StatusCode.UNAUTHENTICATED


def test_a_running_job_s_credential_passes_the_gate(head: Head, tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("x\n1\n")
    spec = DatasetSpec(location=str(tmp_path / "data.csv"), format="csv", inputs=["x"])
    store = Store(head.db)
    store.add_job("j-1", "j", "inference", "name: j", "", str(tmp_path / "out"), 1, [(0, 1)])
    store.close()
    from farm import data

    for name, content in datasets.files(spec, data.plan(spec)).items():
        write_private(datasets.job_dir(head.settings.state_dir, "j-1") / name, content)
    token = datasets.read_token(head.settings.state_dir, "j-1")
    assert token
    # Through the gate to the servicer: a file the plan does not name is not found, not unauthenticated.
    assert read(head, token, "not-in-the-plan").code() is grpc.StatusCode.NOT_FOUND
