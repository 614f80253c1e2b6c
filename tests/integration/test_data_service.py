"""The head's DataService on a real in-process head (TLS, its own CA): a node reads a job's dataset on the head's
machine through it with the job's read credential only, and only that dataset's files, only while the job runs."""

from __future__ import annotations

import dataclasses
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm import data
from farm.core.dataset import DatasetSpec
from farm.core.models import JobState
from farm.core.tasks import HeadAccess
from farm.data.locations.head import BLOCK, HeadFileSystem
from farm.head import datasets
from farm.head.store import Store
from farm.local import write_private
from farm.proto.v1 import data_pb2, data_pb2_grpc, job_pb2, job_pb2_grpc
from tests.integration.inprocess_head import Head, running_head


@pytest.fixture()
def head(tmp_path: Path):  # type: ignore[no-untyped-def]
    with running_head(tmp_path / "state") as head:
        yield head


def add_job(head: Head, job_id: str, spec: DatasetSpec) -> tuple[HeadAccess, data.DatasetPlan]:
    plan = data.plan(spec)
    store = Store(head.db)
    store.add_job(job_id, "j", "inference", "name: j", "", str(head.settings.state_dir.parent / "out"), 10, [(0, 10)])
    store.close()
    for name, content in datasets.files(spec, plan).items():  # as Jobs.submit keeps them
        write_private(datasets.job_dir(head.settings.state_dir, job_id) / name, content)
    token = datasets.read_token(head.settings.state_dir, job_id)
    assert token
    return HeadAccess(address=head.settings.address, ca_pem=head.ca_pem, job_id=job_id, token=token,
                      data_address=head.settings.data_address), plan


def peak_while(read: Callable[[int], None], readers: int) -> int:
    """The most Python memory held (tracemalloc) while `readers` threads run read(0), read(1), ... at once."""
    import threading

    tracemalloc.start()
    try:
        threads = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_node_reads_a_head_dataset_by_ranges_with_the_job_s_credential(head: Head, tmp_path: Path) -> None:
    folder = tmp_path / "pq"
    folder.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"x": np.arange(i * 500, i * 500 + 500)}), folder / f"{i}.parquet",
                       row_group_size=64)
    access, plan = add_job(head, "j-1", DatasetSpec(location=str(folder), format="parquet", inputs=["x"]))
    batches = list(data.read(plan, 300, 700, ["x"], 100, access))
    assert sum(b.num_rows for b in batches) == 400
    assert [v for b in batches for v in b.column("x").to_pylist()] == list(range(300, 700))
    assert "token" not in repr(access) and access.token not in repr(access)


def test_a_node_reading_parquet_through_the_head_holds_a_row_group_not_a_read_ahead_block(head: Head,
                                                                                          tmp_path: Path) -> None:
    """pyarrow reads each column chunk it needs whole: the head's 16 MiB read-ahead block held a copy of it and the
    bytes past it (three such blocks at once while the next arrived), so a worker's peak grew with the files' size."""
    group = 8192  # rows of 32 random float32: 1 MiB a row group, uncompressed; 24 of them, more than a block
    values = np.random.default_rng(0).random((24 * group, 32), dtype=np.float32)
    pq.write_table(pa.table({"v": pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 32)}),
                   tmp_path / "d.parquet", row_group_size=group, compression="none")
    access, plan = add_job(head, "j-1", DatasetSpec(location=str(tmp_path / "d.parquet"), format="parquet",
                                                     inputs=["v"]))
    tracemalloc.start()
    try:
        rows = sum(batch.num_rows for batch in data.read(plan, 0, plan.size, ["v"], 1024, access))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows == 24 * group
    assert peak < BLOCK // 2, peak


@pytest.mark.parametrize("port", ["main", "data"])
def test_the_credential_reaches_its_own_job_s_files_only(head: Head, tmp_path: Path, port: str) -> None:
    """On the head's main port and on its data port (the data lanes) alike."""
    (tmp_path / "a.txt").write_text("a\nb\n")
    (tmp_path / "secret.txt").write_text("not in any plan\n")
    access, _ = add_job(head, "j-1", DatasetSpec(location=str(tmp_path / "a.txt")))
    other, _ = add_job(head, "j-2", DatasetSpec(location=str(tmp_path / "a.txt")))
    address = head.settings.address if port == "main" else head.settings.data_address
    with grpc.secure_channel(address, grpc.ssl_channel_credentials(head.ca_pem)) as channel:
        stub = data_pb2_grpc.DataServiceStub(channel)

        def read(job_id: str, token: str, path: str = "") -> bytes:
            request = data_pb2.ReadRequest(job_id=job_id, path=path, offset=0, length=100)
            return b"".join(c.data for c in stub.Read(request, metadata=(("authorization", f"Bearer {token}"),)))

        assert read("j-1", access.token) == b"a\nb\n"
        for job_id, token, path, code in [
            ("j-1", other.token, "", grpc.StatusCode.UNAUTHENTICATED),  # another job's credential
            ("j-1", head.tokens.api, "", grpc.StatusCode.UNAUTHENTICATED),  # not even the API token
            ("j-1", access.token, "../secret.txt", grpc.StatusCode.NOT_FOUND),  # outside the plan
            ("j-9", access.token, "", grpc.StatusCode.UNAUTHENTICATED),  # no such job
        ]:
            with pytest.raises(grpc.RpcError) as caught:
                read(job_id, token, path)
            assert caught.value.code() is code, (job_id, path, caught.value.details())
        store = Store(head.db)
        store.set_job_state("j-1", JobState.CANCELLED)
        store.close()
        with pytest.raises(grpc.RpcError, match="has ended"):
            read("j-1", access.token)


def test_a_dataset_inside_the_state_folder_is_refused(head: Head) -> None:
    from farm.core.errors import SpecError

    with pytest.raises(SpecError, match="inside the head's state folder"):
        datasets.check_location(DatasetSpec(location=str(head.settings.state_dir / "secrets.json"), format="text"),
                                head.settings.state_dir)


def test_a_planned_file_inside_the_state_folder_is_not_served(head: Head) -> None:
    """Checked again at every read, whatever the plan says (a plan made before the state folder moved there, say): the
    state folder's real path against the file's path as opened, which follows no link."""
    inside = head.settings.state_dir / "kept"
    inside.mkdir()
    (inside / "a.txt").write_text("the head's own\n")
    access, _ = add_job(head, "j-1", DatasetSpec(location=str(inside / "a.txt")))  # past check_location, as planned
    with grpc.secure_channel(head.settings.address, grpc.ssl_channel_credentials(head.ca_pem)) as channel:
        request = data_pb2.ReadRequest(job_id="j-1", path="", offset=0, length=100)
        with pytest.raises(grpc.RpcError) as caught:
            list(data_pb2_grpc.DataServiceStub(channel).Read(
                request, metadata=(("authorization", f"Bearer {access.token}"),)))
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND, caught.value.details()


def test_every_format_reads_through_the_head(head: Head, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    from farm.data.batches import numpy_batch

    (tmp_path / "imgs").mkdir()
    for i in range(5):
        Image.fromarray(np.full((2, 2), i, np.uint8)).save(tmp_path / "imgs" / f"{i}.png")
    np.save(tmp_path / "a.npy", np.arange(40, dtype=np.float32).reshape(20, 2))
    (tmp_path / "a.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(30)))
    access, plan = add_job(head, "j-i", DatasetSpec(location=str(tmp_path / "imgs"), format="images"))
    monkeypatch.setattr(HeadFileSystem, "info", lambda *a, **k: pytest.fail("a Stat before each image"))
    monkeypatch.setattr(HeadFileSystem, "read_range", lambda *a, **k: pytest.fail("a call per image"))
    batch = next(data.read(plan, 1, 4, None, 8, access))
    monkeypatch.undo()
    assert numpy_batch(batch, ["image"], plan.format, plan.location)["image"][:, 0, 0].tolist() == [1, 2, 3]
    access, plan = add_job(head, "j-n", DatasetSpec(location=str(tmp_path / "a.npy")))
    rows = [r for b in data.read(plan, 5, 15, None, 4, access) for r in b.column("data").to_pylist()]
    assert rows == [[2.0 * i, 2.0 * i + 1] for i in range(5, 15)]
    access, plan = add_job(head, "j-l", DatasetSpec(location=str(tmp_path / "a.jsonl"), inputs=["x"]))
    values = [v for b in data.read(plan, 0, plan.size, ["x"], 7, access) for v in b.column("x").to_pylist()]
    assert values == list(range(30))


class CountingStub:
    """The head's DataService stub, counting the calls made through it."""

    def __init__(self, stub: data_pb2_grpc.DataServiceStub) -> None:
        self.stub = stub
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        method = getattr(self.stub, name)

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls[name] = self.calls.get(name, 0) + 1
            return method(*args, **kwargs)

        return counted


def test_a_shard_of_10000_small_files_is_tens_of_calls_each_file_once_in_order(head: Head, tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(10_000):
        (folder / f"{i:05d}.png").write_bytes(b"%d" % i * (1 + i % 7))  # read as bytes: decoding is the node's
    access, plan = add_job(head, "j-1", DatasetSpec(location=str(folder), format="images"))
    fs = HeadFileSystem(access)
    fs.stub = CountingStub(fs.stub)  # type: ignore[assignment]
    rows = [(r, bytes(v), p) for b in data.read(plan, 0, 10_000, None, 256, fs=fs, root="")
            for r, v, p in zip(b.column("row_id").to_pylist(), b.column("image").to_pylist(),
                               b.column("path").to_pylist())]
    assert [r for r, _, _ in rows] == list(range(10_000))
    assert all(v == b"%d" % i * (1 + i % 7) and p == f"{i:05d}.png" for i, (_, v, p) in enumerate(rows))
    assert sum(fs.stub.calls.values()) <= 50, fs.stub.calls  # type: ignore[attr-defined]


def test_a_batch_with_one_unreadable_file_names_it_and_the_calls_before_it_stand(head: Head, tmp_path: Path) -> None:
    from PIL import Image

    from farm.core.errors import DataError
    from farm.data.batches import numpy_batch

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(6):
        Image.fromarray(np.full((2, 2), i, np.uint8)).save(folder / f"{i}.png")
    access, plan = add_job(head, "j-1", DatasetSpec(location=str(folder), format="images"))
    (folder / "3.png").write_bytes(b"not a png")
    batch = next(data.read(plan, 0, 6, None, 6, access))
    with pytest.raises(DataError, match=r"3\.png \(row 3\): the image does not decode"):
        numpy_batch(batch, ["image"], plan.format, plan.location)
    (folder / "4.png").unlink()  # gone since planning: that file's error, the files before it read
    batches = data.read(plan, 0, 6, None, 2, access)
    assert [b.num_rows for b in (next(batches), next(batches))] == [2, 2]
    with pytest.raises(DataError, match=r"4\.png \(row 4\): does not read"):
        next(batches)
    fs = HeadFileSystem(access)
    found = fs.cat(["0.png", "4.png", "5.png"], on_error="return")
    assert isinstance(found["4.png"], FileNotFoundError) and isinstance(found["5.png"], bytes)


def test_a_file_read_on_has_its_next_block_in_flight_and_random_reads_stay_exact(head: Head, tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    """Issue 28 item 4: a file object reading on waited for each block to be asked before the head sent any of it.
    Now the range after a sequential read is in flight before it is asked for, one range ahead at most."""
    payload = np.random.default_rng(0).integers(0, 255, 5 * BLOCK + 12345, dtype=np.uint8)
    np.save(tmp_path / "big.npy", payload)
    access, _ = add_job(head, "j-9", DatasetSpec(location=str(tmp_path / "big.npy"), format="npy"))
    fs = HeadFileSystem(access)
    events: list[tuple[str, int, int]] = []  # ("asked", start, end) by the reader; ("read", ...) from the head
    sent: list[int] = []
    chunks, ranged = HeadFileSystem._chunks, HeadFileSystem._range

    def read(self: HeadFileSystem, path: str, start: int, end: int, *on: object) -> list[bytes]:
        events.append(("read", start, end))  # as it goes out
        got = chunks(self, path, start, end, *on)
        sent.append(sum(map(len, got)))  # what the head sent (nothing past the file's end)
        return got

    def asked(self: HeadFileSystem, path: str, start: int, end: int) -> list[bytes]:
        events.append(("asked", start, end))
        return ranged(self, path, start, end)

    monkeypatch.setattr(HeadFileSystem, "_chunks", read)
    monkeypatch.setattr(HeadFileSystem, "_range", asked)
    whole = (tmp_path / "big.npy").read_bytes()
    with fs.open("", "rb") as handle:
        parts = []
        while part := handle.read(BLOCK):  # as the .npy and text formats read
            parts.append(part)
        on = b"".join(parts)
        handle.seek(1000)  # random access after: exact bytes, from what was read ahead or not
        again = handle.read(5000)
    assert on == whole and again == whole[1000:6000]
    ranges = [(i, a, b) for i, (kind, a, b) in enumerate(events) if kind == "asked"]
    assert len(ranges) >= 3
    for i, start, _ in ranges[2:-1]:  # every range after the second read on: its first piece went before it was asked
        assert any(kind == "read" and a == start for kind, a, _ in events[:i]), (start, events)
    assert sum(sent) <= len(whole) + max(b - a for _, a, b in ranges) + 5000  # at most one range ahead wasted


def test_a_job_s_plan_is_loaded_once_not_at_every_call(head: Head, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28 item 4: every Read and ReadFiles call loaded and validated the job's whole plan again (a folder of
    65,536 images: longer than reading its files). Its credential still counts at every call."""
    from farm.head import data_service

    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(20):
        (folder / f"{i:02d}.txt").write_text(f"{i}\n" * 10)
    access, plan = add_job(head, "j-7", DatasetSpec(location=str(folder), format="text"))
    loads = []
    load = data_service.datasets.load
    monkeypatch.setattr(data_service.datasets, "load", lambda *a: loads.append(a) or load(*a))
    fs = HeadFileSystem(access)
    reads = []
    chunks = HeadFileSystem._chunks
    monkeypatch.setattr(HeadFileSystem, "_chunks", lambda self, *a: reads.append(a) or chunks(self, *a))
    for i in range(20):
        assert fs.cat_file(f"{i:02d}.txt") == f"{i}\n".encode() * 10
    assert len(loads) <= 1 and len(reads) == 20  # one Read a small file (it was 16, 15 of them past its end)
    forged = HeadFileSystem(dataclasses.replace(access, token="x" * len(access.token)))
    with pytest.raises(OSError, match="credential"):
        forged.cat_file("00.txt")


def test_the_data_port_serves_the_data_service_only(head: Head) -> None:
    with grpc.secure_channel(head.settings.data_address, grpc.ssl_channel_credentials(head.ca_pem)) as channel:
        jobs = job_pb2_grpc.JobServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            jobs.List(job_pb2.ListJobsRequest(), metadata=(("authorization", f"Bearer {head.tokens.api}"),))
    assert caught.value.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAUTHENTICATED)


def test_a_large_read_comes_whole_and_in_order_over_several_connections(head: Head, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28 item 4: a long range's pieces go out on `streams` connections to the head's data port at once (each
    its own TCP connection, so several of the head's lanes send) and come back joined in order."""
    import psutil

    import farm.data.locations.head as located

    monkeypatch.setattr(located, "PIECE", 256 * 1024)  # many pieces a range
    payload = np.random.default_rng(1).integers(0, 255, 3 * BLOCK + 4321, dtype=np.uint8)
    np.save(tmp_path / "big.npy", payload)
    access, _ = add_job(head, "j-3", DatasetSpec(location=str(tmp_path / "big.npy"), format="npy"))
    fs = HeadFileSystem(access, streams=4)
    whole = (tmp_path / "big.npy").read_bytes()
    assert fs.cat_file("") == whole
    with fs.open("", "rb") as handle:
        assert b"".join(iter(lambda: handle.read(BLOCK // 3), b"")) == whole
    assert fs.read_range("", 1000, 1000 + 3 * 256 * 1024 + 7) == whole[1000:1000 + 3 * 256 * 1024 + 7]
    connections = {c.laddr for c in psutil.Process().net_connections("tcp")
                   if c.raddr and c.raddr.port == head.settings.data_listen_port}
    assert len(connections) >= 4, connections


def test_a_failed_piece_fails_the_read_saying_why(head: Head, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    import errno
    import os

    import farm.data.locations.head as located
    import farm.head.data_service as service

    monkeypatch.setattr(located, "PIECE", 256 * 1024)
    (tmp_path / "big.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: 8 pieces
    access, _ = add_job(head, "j-4", DatasetSpec(location=str(tmp_path / "big.bin"), format="text"))
    pread = os.pread

    def failing(fd: int, n: int, offset: int) -> bytes:
        if offset >= 5 * 256 * 1024:  # the sixth piece on: a disk that fails there
            raise OSError(errno.EIO, "Input/output error")
        return pread(fd, n, offset)

    monkeypatch.setattr(service.os, "pread", failing)
    with pytest.raises(OSError, match="does not read: Input/output error"):
        HeadFileSystem(access, streams=4).cat_file("")


def test_sixteen_concurrent_large_reads_stay_under_the_service_s_memory_bound(head: Head, tmp_path: Path) -> None:
    """Each Read holds at most two chunks on the head whatever its length; 16 at once over the data lanes hold 16
    times that, not the 16 files (the Python side, which is what the service allocates; gRPC's own buffers are
    bounded by HTTP/2 flow control)."""

    from farm.data.locations.head import lanes
    from farm.head.data_service import CHUNK

    size = 24 * CHUNK
    (tmp_path / "big.bin").write_bytes(np.random.default_rng(2).bytes(size))
    access, _ = add_job(head, "j-5", DatasetSpec(location=str(tmp_path / "big.bin"), format="text"))
    stubs = [data_pb2_grpc.DataServiceStub(c) for c in lanes(access.data_address, access.ca_pem, 16)]
    metadata = (("authorization", f"Bearer {access.token}"),)
    got = [0] * 16

    def read(i: int) -> None:
        request = data_pb2.ReadRequest(job_id="j-5", path="", offset=0, length=size)
        for chunk in stubs[i].Read(request, metadata=metadata, timeout=120):
            got[i] += len(chunk.data)

    peak = peak_while(read, 16)
    assert got == [size] * 16
    assert peak < 16 * 6 * CHUNK, peak  # a few chunks a call on each side, against 16 x 24 MiB read


def test_files_of_every_size_come_whole_and_in_order_from_one_call(head: Head, tmp_path: Path) -> None:
    """Small files share a trip to the head's read pool and a message; a file past a message's bytes (CHUNK) is
    sent on in parts while the files after it wait their turn: each arrives whole, in order, at every boundary."""
    from farm.head.data_service import CHUNK

    folder = tmp_path / "mixed"
    folder.mkdir()
    sizes = [0, 10, CHUNK - 1, CHUNK, CHUNK + 1, *[300] * 40, 3 * CHUNK + 5, 7, 2 * CHUNK, *[70_000] * 30, 1]
    rng = np.random.default_rng(0)
    contents = {f"{i:03d}.png": rng.bytes(size) for i, size in enumerate(sizes)}
    for name, content in contents.items():
        (folder / name).write_bytes(content)
    access, plan = add_job(head, "j-1", DatasetSpec(location=str(folder), format="images"))
    names = [f.path for f in plan.files]
    got = list(HeadFileSystem(access).iter_files(names))
    assert [name for name, _ in got] == sorted(contents)
    assert all(value == contents[name] for name, value in got)


def test_a_call_ended_early_leaves_no_file_of_the_dataset_open_in_the_head(head: Head, tmp_path: Path) -> None:
    """A reader that stops (a shard cancelled) ends its calls mid-way: the head's descriptors of the dataset's folder
    and of the files it had started are closed, also those its read pool opened after the call ended."""
    import os
    import time

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(600):  # enough bytes a call that HTTP/2's flow control holds the head mid-call
        (folder / f"{i:05d}.png").write_bytes(os.urandom(1_500_000 if i % 50 == 0 else 100_000))
    access, plan = add_job(head, "j-1", DatasetSpec(location=str(folder), format="images"))

    def open_in_folder() -> list[str]:  # the head runs in this process
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target == str(folder) or target.startswith(f"{folder}/"):
                found.append(target)
        return found

    files = HeadFileSystem(access).iter_files([f.path for f in plan.files])
    for _ in range(10):
        next(files)
    assert open_in_folder()  # the calls ahead hold the folder and the files they started
    files.close()  # cancels them
    deadline = time.monotonic() + 10
    while open_in_folder() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert open_in_folder() == []


def test_a_reader_that_stops_cancels_the_call_it_was_reading_too(head: Head, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the calls ahead were cancelled; the one being read was left to garbage collection, and the head went on
    sending its files (holding them open) for as long as anything still held the call."""
    import farm.data.locations.head as head_location

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(64):  # more than HTTP/2's flow control lets the head send before the reader takes it
        (folder / f"{i:05d}.png").write_bytes(b"x" * 200_000)
    access, plan = add_job(head, "j-1", DatasetSpec(location=str(folder), format="images"))
    read: list[grpc.Call] = []  # held here: garbage collection cannot cancel them
    gathered = head_location._gathered
    monkeypatch.setattr(head_location, "_gathered", lambda paths, call: read.append(call) or gathered(paths, call))
    files = HeadFileSystem(access).iter_files([f.path for f in plan.files])
    next(files)
    files.close()
    assert read and all(not call.is_active() for call in read)
