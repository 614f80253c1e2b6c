"""Finding 12: some bad input still answered gRPC UNKNOWN (an unhandled exception in the head), where README promises
one line and a status that says whose mistake it is. Each case goes through a real head's Submit (in-process, real
gRPC and TLS): an http(s) dataset on a server that ignores Range requests (python's own http.server on 127.0.0.1), a
Parquet file that is not one, and the lying zip of finding 7."""

from __future__ import annotations

import contextlib
import functools
import http.server
import io
import sqlite3
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm import data
from farm.core.dataset import DatasetSpec
from farm.proto.v1 import job_pb2, job_pb2_grpc
from tests.integration.inprocess_head import Head, running_head
from tests.security.test_lying_zip import lying_zip
from tests.servers import serve_http


class WholeFiles(http.server.SimpleHTTPRequestHandler):
    """Python's file server as it is: it ignores Range and answers every GET with the whole file (200)."""

    def log_message(self, *args: object) -> None:
        pass

    def copyfile(self, source, outputfile) -> None:  # type: ignore[no-untyped-def]
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a reader hung up on a body it did not want
            super().copyfile(source, outputfile)


@contextlib.contextmanager
def serve_whole_files(folder: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(WholeFiles, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def a_parquet_file(path: Path, rows: int = 1000) -> Path:
    pq.write_table(pa.table({"x": np.arange(rows, dtype=np.float32)}), path, row_group_size=100)
    return path


def code(*names: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in names:
            archive.writestr(name, "x")
    return buffer.getvalue()


def submit(head: Head, location: str, code_zip: bytes = b"", fmt: str = "parquet") -> grpc.RpcError:
    """A Submit of a job over the dataset at `location`; the error it gets."""
    spec = f"name: bad\nmodel: job:build\ndataset:\n  location: {location}\n  format: {fmt}\n  inputs: [x]\nshards: 2\n"
    request = job_pb2.SubmitRequest(spec_yaml=spec, code_zip=code_zip or code("job.py"), items=10,
                                    output=str(head.settings.state_dir.parent / "out"))
    with head.channel() as channel, pytest.raises(grpc.RpcError) as failed:
        job_pb2_grpc.JobServiceStub(channel).Submit(
            request, metadata=(("authorization", f"Bearer {head.tokens.api}"),), timeout=60)
    return failed.value


def assert_refused_in_one_line(head: Head, error: grpc.RpcError, *words: str) -> None:
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    details = error.details() or ""
    assert "\n" not in details and "Traceback" not in details
    assert all(word in details for word in words), details
    assert sqlite3.connect(head.db).execute("SELECT COUNT(*) FROM jobs").fetchone() == (0,)


@pytest.fixture()
def head(tmp_path: Path) -> Iterator[Head]:
    with running_head(tmp_path / "state") as running:
        yield running


@pytest.mark.parametrize("rows", [1000, 2_000_000])  # within fsspec's first block, and well past it
def test_an_http_dataset_on_a_server_that_ignores_range_is_refused_at_submit(head: Head, tmp_path: Path,
                                                                            rows: int) -> None:
    folder = tmp_path / "www"
    folder.mkdir()
    a_parquet_file(folder / "d.parquet", rows)
    with serve_whole_files(folder) as url:
        error = submit(head, f"{url}/d.parquet")
    assert_refused_in_one_line(head, error, f"{url}/d.parquet", "range requests")


def test_a_line_file_on_such_a_server_is_refused_too(head: Head, tmp_path: Path) -> None:
    """A JSON Lines file plans from its size alone; its shards would then read from the middle, and fail on a node."""
    folder = tmp_path / "www"
    folder.mkdir()
    (folder / "d.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(100)))
    with serve_whole_files(folder) as url:
        error = submit(head, f"{url}/d.jsonl", fmt="jsonl")
    assert_refused_in_one_line(head, error, "range requests")


def test_an_http_dataset_on_a_server_that_answers_ranges_plans(tmp_path: Path) -> None:
    a_parquet_file(tmp_path / "d.parquet")
    with serve_http(tmp_path) as url:
        assert data.plan(DatasetSpec(location=f"{url}/d.parquet", inputs=["x"])).rows == 1000


def test_a_parquet_file_that_is_not_one_is_refused_at_submit(head: Head, tmp_path: Path) -> None:
    (tmp_path / "d.parquet").write_bytes(b"not parquet at all\n" * 100)
    assert_refused_in_one_line(head, submit(head, str(tmp_path / "d.parquet")), "d.parquet", "Parquet")


def test_a_lying_zip_is_refused_at_submit(head: Head, tmp_path: Path) -> None:
    a_parquet_file(tmp_path / "d.parquet")
    archive = lying_zip(declared=1024, actual=450 * 1024 * 1024)  # past the head's 400 MB unzipped
    assert_refused_in_one_line(head, submit(head, str(tmp_path / "d.parquet"), archive), "main.py")
