"""A job's output folder is its own: a second job refuses a folder holding another job's results unless told to
overwrite them (then they go, and the user's other files stay); a URI output the head cannot write is one line."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.core.errors import ConflictError, UserError
from tests.integration.inprocess_head import Head, running_head

SPEC = "name: toy\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nshards: 2\n"


def code() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("toyjob.py", "x")
    return buffer.getvalue()


@pytest.fixture()
def head(tmp_path: Path) -> Iterator[Head]:
    with running_head(tmp_path / "state") as running:
        yield running


def test_a_folder_holding_another_jobs_results_is_refused_unless_overwritten(head: Head, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with head.client() as client:
        first = client.submit(SPEC, code(), items=10, output=str(out))
        # While the first job can still write there, no second job shares the folder, overwrite or not.
        for overwrite in (False, True):
            with pytest.raises(UserError, match=f"output {out} is where job {first}"):
                client.submit(SPEC, code(), items=10, output=str(out), overwrite=overwrite)
        client.cancel(first)
        out.mkdir()
        (out / "shard-00000.npy").write_bytes(b"the first job's")  # as its shards would be
        (out / "manifest.json").write_text("{}")
        (out / "notes.txt").write_text("the user's own file")
        with pytest.raises(ConflictError, match=r"already holds another job's results \(manifest.json, \.\.\.\)"):
            client.submit(SPEC, code(), items=10, output=str(out))
        second = client.submit(SPEC, code(), items=10, output=str(out), overwrite=True)
    assert second != first
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # the results went, the user's file stayed


def test_nothing_is_created_at_submit(head: Head, tmp_path: Path) -> None:
    with head.client() as client:
        client.submit(SPEC, code(), items=10, output=str(tmp_path / "later"))
    assert not (tmp_path / "later").exists()


def test_an_output_uri_is_refused_with_one_line(head: Head) -> None:
    # s3:// outputs are supported since the data plane (results written to a bucket); gs:// is not
    with head.client() as client, pytest.raises(UserError, match="gs:// outputs are not supported yet"):
        client.submit(SPEC + "output: gs://bucket/out\n", code(), items=10, output="/tmp/gs:/bucket/out")
