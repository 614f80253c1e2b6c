"""Issue 30, finding 1: DataService followed a link after checking the path. A local user who owns a dataset folder on
the head's machine swapped a planned file for a symlink after submit, and the job's read credential read what the link
named (the head's own files, /etc/shadow) through the root head. The head now opens every component without following
links and serves regular files of the plan only."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from farm.core.dataset import DatasetSpec
from farm.proto.v1 import data_pb2, data_pb2_grpc
from tests.integration.inprocess_head import Head, running_head
from tests.integration.test_data_service import add_job


@pytest.fixture()
def head(tmp_path: Path):  # type: ignore[no-untyped-def]
    with running_head(tmp_path / "state") as head:
        yield head


def _read(head: Head, job_id: str, token: str, path: str) -> bytes:
    with grpc.secure_channel(head.settings.address, grpc.ssl_channel_credentials(head.ca_pem)) as channel:
        stub = data_pb2_grpc.DataServiceStub(channel)
        request = data_pb2.ReadRequest(job_id=job_id, path=path, offset=0, length=1000)
        return b"".join(c.data for c in stub.Read(request, metadata=(("authorization", f"Bearer {token}"),),
                                                  timeout=20))


@pytest.mark.parametrize("swap", ["file", "folder"])
def test_a_planned_file_swapped_for_a_link_after_planning_is_not_read(head: Head, tmp_path: Path, swap: str) -> None:
    secret = tmp_path / "secret.txt"  # outside the dataset and outside the head's state folder
    secret.write_text("the admin's secret\n")
    folder = tmp_path / "lines"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.txt").write_text("a\n")
    access, plan = add_job(head, "j-1", DatasetSpec(location=str(folder), format="text"))
    assert [f.path for f in plan.files] == ["sub/a.txt"]
    assert _read(head, "j-1", access.token, "sub/a.txt") == b"a\n"
    if swap == "file":  # the file itself becomes a link
        (folder / "sub" / "a.txt").unlink()
        os.symlink(secret, folder / "sub" / "a.txt")
    else:  # a folder on the way becomes a link to a folder holding a file of that name
        decoy = tmp_path / "decoy"
        decoy.mkdir()
        os.symlink(secret, decoy / "a.txt")
        (folder / "sub" / "a.txt").unlink()
        (folder / "sub").rmdir()
        os.symlink(decoy, folder / "sub")
    with pytest.raises(grpc.RpcError) as caught:
        _read(head, "j-1", access.token, "sub/a.txt")
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND, caught.value.details()
    assert "link" in (caught.value.details() or "")


def test_a_planned_file_swapped_for_a_fifo_is_refused_without_blocking(head: Head, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    access, _ = add_job(head, "j-1", DatasetSpec(location=str(tmp_path / "a.txt")))
    (tmp_path / "a.txt").unlink()
    os.mkfifo(tmp_path / "a.txt")  # opened for reading, a FIFO would wait for a writer forever
    with pytest.raises(grpc.RpcError) as caught:
        _read(head, "j-1", access.token, "")
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND, caught.value.details()


def test_a_hard_link_put_in_a_planned_file_s_place_is_not_read(head: Head, tmp_path: Path) -> None:
    """No link on the way, yet another file: a hard link to a file elsewhere (the admin's secret, on the same
    filesystem) put where a planned file was. The plan records each file's identity (st_dev, st_ino), and what the
    head opens must be that file. (A new file written there may reuse the old inode: it holds only what its writer
    wrote, no one else's secret.)"""
    secret = tmp_path / "secret.txt"
    secret.write_text("the admin's secret\n")
    folder = tmp_path / "lines"
    folder.mkdir()
    (folder / "a.txt").write_text("a\n")
    access, _ = add_job(head, "j-1", DatasetSpec(location=str(folder), format="text"))
    assert _read(head, "j-1", access.token, "a.txt") == b"a\n"
    (folder / "a.txt").unlink()
    os.link(secret, folder / "a.txt")
    with pytest.raises(grpc.RpcError) as caught:
        _read(head, "j-1", access.token, "a.txt")
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND, caught.value.details()
    assert "replaced" in (caught.value.details() or "")


@pytest.mark.parametrize("swap", ["file", "folder", "root"])
def test_a_batched_read_follows_no_link_swapped_in_after_planning(head: Head, tmp_path: Path, swap: str) -> None:
    """The same, for the batched reads an image folder's shards make (ReadFiles, which opens the dataset's root once
    a call and each file from there): a file, a folder on the way, or the dataset's root itself become links."""
    from farm.data.locations.head import HeadFileSystem

    secret = tmp_path / "secret"
    (secret / "sub").mkdir(parents=True)
    (secret / "sub" / "a.png").write_text("the admin's secret\n")
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.png").write_text("a\n")
    (folder / "b.png").write_text("b\n")
    access, plan = add_job(head, "j-1", DatasetSpec(location=str(folder), format="images"))
    fs = HeadFileSystem(access)
    assert fs.cat(["b.png", "sub/a.png"]) == {"b.png": b"b\n", "sub/a.png": b"a\n"}
    if swap == "file":
        (folder / "sub" / "a.png").unlink()
        os.symlink(secret / "sub" / "a.png", folder / "sub" / "a.png")
    elif swap == "folder":
        (folder / "sub" / "a.png").unlink()
        (folder / "sub").rmdir()
        os.symlink(secret / "sub", folder / "sub")
    else:
        os.rename(folder, tmp_path / "moved")
        os.symlink(secret, folder)
    if swap == "root":  # the whole call is refused
        with pytest.raises(FileNotFoundError, match="is now a link"):
            fs.cat(["b.png", "sub/a.png"], on_error="return")
        return
    found = fs.cat(["b.png", "sub/a.png"], on_error="return")
    assert found["b.png"] == b"b\n", found
    assert isinstance(found["sub/a.png"], FileNotFoundError) and "link" in str(found["sub/a.png"]), found


def test_a_refused_open_leaves_no_descriptor_behind(tmp_path: Path) -> None:
    """Each refusal (a link on the way, a missing file, a FIFO) closes what the walk opened, "/" included: a lender
    asking again and again must not run the head out of descriptors."""
    from farm.core.errors import NotFoundError
    from farm.head.planned_files import open_folder, open_planned

    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.mkfifo(tmp_path / "real" / "fifo")
    def held() -> int:  # descriptors of "/" and below tmp_path (not other threads' sockets and files)
        found = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            found += target == "/" or target.startswith(str(tmp_path))
        return found

    before = held()
    for _ in range(50):
        for root, path in ((str(tmp_path / "link"), "a.txt"), (str(tmp_path / "real"), "missing.txt"),
                           (str(tmp_path / "real"), "fifo")):
            with pytest.raises((NotFoundError, OSError)):
                open_planned(root, path)
        with pytest.raises(NotFoundError):
            open_folder(str(tmp_path / "link"))
    assert held() == before
