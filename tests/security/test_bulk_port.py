"""The head's bulk port (farm.head.bulk) on a real in-process head with TLS: a node reads ranges of a job's large
files over plain TLS connections, with the job's read credential only, only its plan's files, only while the job
runs; what is not a request closes its connection and the head serves on; memory stays bounded (issue 28, item 4)."""

from __future__ import annotations

import dataclasses
import socket
import ssl
import struct
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest

from farm.core.dataset import DatasetSpec
from farm.core.models import JobState
from farm.core.tasks import HeadAccess
from farm.data.locations.head import BLOCK, PIECE, BulkReader, HeadFileSystem
from farm.head.bulk import CHUNK, REQUEST_MAX
from farm.head.store import Store
from tests.integration.inprocess_head import Head, running_head
from tests.integration.test_data_service import add_job, peak_while


@pytest.fixture()
def head(tmp_path: Path):  # type: ignore[no-untyped-def]
    with running_head(tmp_path / "state") as head:
        yield head


def bulk_job(head: Head, job_id: str, location: Path) -> HeadAccess:
    access, _ = add_job(head, job_id, DatasetSpec(location=str(location), format="npy"))
    return dataclasses.replace(access, bulk_address=head.settings.bulk_address)


def test_a_large_read_comes_whole_and_in_order_over_the_bulk_port(head: Head, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import farm.data.locations.head as located

    monkeypatch.setattr(located, "PIECE", 256 * 1024)  # many pieces a range, on several connections at once
    np.save(tmp_path / "big.npy", np.random.default_rng(1).integers(0, 255, 3 * BLOCK + 4321, dtype=np.uint8))
    fs = HeadFileSystem(bulk_job(head, "j-1", tmp_path / "big.npy"), streams=4)
    whole = (tmp_path / "big.npy").read_bytes()
    assert fs.cat_file("") == whole
    with fs.open("", "rb") as handle:
        assert b"".join(iter(lambda: handle.read(BLOCK // 3), b"")) == whole
    assert fs.read_range("", 1000, 1000 + 3 * 256 * 1024 + 7) == whole[1000:1000 + 3 * 256 * 1024 + 7]
    assert fs.read_range("", len(whole) - 10, len(whole) + 1000) == whole[-10:]  # fewer at the file's end
    relays = {p.pid for p in psutil.Process().children()
              for c in p.net_connections("tcp") if c.raddr and c.raddr.port == head.settings.bulk_listen_port}
    assert len(relays) >= 2, relays  # each connection in a relay process of its own, decrypting on its own core
    assert not [c for c in psutil.Process().net_connections("tcp")
                if c.raddr and c.raddr.port == head.settings.bulk_listen_port]


def test_the_bulk_port_reads_with_the_job_s_credential_only_its_files_only_while_it_runs(head: Head,
                                                                                         tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(1000))
    access = bulk_job(head, "j-2", tmp_path / "a.npy")
    reader = BulkReader(access.bulk_address, access.ca_pem)
    assert bytes(reader.read(access, "", 0, 64)) == (tmp_path / "a.npy").read_bytes()[:64]

    with pytest.raises(PermissionError, match="invalid or missing read credential"):
        reader.read(dataclasses.replace(access, token="x" * 32), "", 0, 64)
    with pytest.raises(FileNotFoundError, match="no file"):
        reader.read(access, "../state/tokens.json", 0, 64)
    store = Store(head.db)
    store.set_job_state("j-2", JobState.SUCCEEDED)
    store.close()
    with pytest.raises(PermissionError, match="has ended"):
        reader.read(access, "", 0, 64)


def test_what_is_not_a_request_closes_its_connection_and_the_head_serves_on(head: Head, tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(1000))
    access = bulk_job(head, "j-3", tmp_path / "a.npy")
    host, port = "127.0.0.1", head.settings.bulk_listen_port
    context = ssl.create_default_context(cadata=access.ca_pem.decode())

    def exchange(payload: bytes) -> bytes:
        with context.wrap_socket(socket.create_connection((host, port), timeout=30), server_hostname=host) as conn:
            conn.sendall(payload)
            said = b""
            while chunk := conn.recv(65536):
                said += chunk
            return said  # the head closed the connection

    said = exchange(struct.pack("!I", REQUEST_MAX + 1))
    assert b"at most" in said
    said = exchange(struct.pack("!I", 9) + b"not json!")
    assert b"a request is a JSON object" in said
    said = exchange(struct.pack("!I", 2) + b"[]")
    assert b"a request is a JSON object" in said
    with socket.create_connection((host, port), timeout=30) as plain:  # no TLS at all
        plain.sendall(b"GET / HTTP/1.0\r\n\r\n" * 10)
        try:
            while plain.recv(65536):
                pass
        except ConnectionResetError:
            pass
    reader = BulkReader(access.bulk_address, access.ca_pem)
    assert bytes(reader.read(access, "", 0, 64)) == (tmp_path / "a.npy").read_bytes()[:64]


def test_sixteen_concurrent_large_reads_on_the_bulk_port_stay_bounded(head: Head, tmp_path: Path) -> None:
    """The head holds one CHUNK a connection, whatever it sends; a node one piece a read in flight. 16 readers of
    24 MiB each, in pieces: the peak is tens of MiB, not the 384 MiB read (both sides are this process here)."""
    np.save(tmp_path / "big.npy", np.random.default_rng(2).integers(0, 255, 24 * CHUNK, dtype=np.uint8))
    size = (tmp_path / "big.npy").stat().st_size
    access = bulk_job(head, "j-4", tmp_path / "big.npy")
    reader = BulkReader(access.bulk_address, access.ca_pem)
    got = [0] * 16

    def read(i: int) -> None:
        for at in range(0, size, PIECE):
            got[i] += len(reader.read(access, "", at, at + PIECE))

    peak = peak_while(read, 16)
    assert got == [size] * 16
    assert peak < 16 * (PIECE + 2 * CHUNK), peak


def test_one_address_holds_at_most_max_per_peer_connections(head: Head, tmp_path: Path) -> None:
    from farm.head.bulk import MAX_PER_PEER

    np.save(tmp_path / "a.npy", np.arange(10))
    access = bulk_job(head, "j-5", tmp_path / "a.npy")
    held = [socket.create_connection(("127.0.0.1", head.settings.bulk_listen_port), timeout=30)
            for _ in range(MAX_PER_PEER)]
    try:
        with socket.create_connection(("127.0.0.1", head.settings.bulk_listen_port), timeout=30) as extra:
            try:
                assert extra.recv(1) == b""  # closed before any byte is read
            except ConnectionResetError:
                pass
        with pytest.raises(OSError):
            BulkReader(access.bulk_address, access.ca_pem).read(access, "", 0, 16)
    finally:
        for conn in held:
            conn.close()
    reader = BulkReader(access.bulk_address, access.ca_pem)
    for _ in range(50):  # the head notices the closed ones as their threads end
        try:
            assert bytes(reader.read(access, "", 0, 16)) == (tmp_path / "a.npy").read_bytes()[:16]
            break
        except OSError:
            threading.Event().wait(0.1)
    else:
        raise AssertionError("the slots were not given back")


def test_a_job_submitted_after_others_were_served_reads_too(head: Head, tmp_path: Path) -> None:
    """The H200 run's failure: a job submitted after the head started was 'no job' on the bulk port (its one store
    shared by the connections' threads). Each connection now has its own."""
    np.save(tmp_path / "a.npy", np.arange(1000))
    first = bulk_job(head, "j-6", tmp_path / "a.npy")
    readers = [BulkReader(first.bulk_address, first.ca_pem) for _ in range(4)]
    threads = [threading.Thread(target=r.read, args=(first, "", 0, 64)) for r in readers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    later = bulk_job(head, "j-7", tmp_path / "a.npy")
    for reader in readers:  # on the connections kept from the first job's reads
        assert bytes(reader.read(later, "", 0, 64)) == (tmp_path / "a.npy").read_bytes()[:64]


def test_a_node_that_cannot_reach_the_bulk_port_reads_on_the_data_port(head: Head, tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A firewall that lets through the data port only (as README asked before the bulk port): the reads go there."""
    from farm.local import free_port

    np.save(tmp_path / "big.npy", np.random.default_rng(3).integers(0, 255, 2 * BLOCK, dtype=np.uint8))
    access = dataclasses.replace(bulk_job(head, "j-8", tmp_path / "big.npy"), bulk_address=f"127.0.0.1:{free_port()}")
    fs = HeadFileSystem(access, streams=4)
    assert fs.cat_file("") == (tmp_path / "big.npy").read_bytes()
    assert fs.bulk is None and "reading on the head's data port instead" in caplog.text


def test_a_relay_that_dies_is_replaced_and_relays_end_with_their_reader(head: Head, tmp_path: Path) -> None:
    """A node's connections to the bulk port live in relay processes (farm.data.locations.bulk_relay): one killed
    between reads (or inside one) costs that read a second try on a new relay; a reader dropped ends its relays."""
    import gc

    np.save(tmp_path / "big.npy", np.random.default_rng(4).integers(0, 255, 3 * PIECE, dtype=np.uint8))
    whole = (tmp_path / "big.npy").read_bytes()
    access = bulk_job(head, "j-9", tmp_path / "big.npy")
    reader = BulkReader(access.bulk_address, access.ca_pem, relays=2)
    assert bytes(reader.read(access, "", 0, PIECE)) == whole[:PIECE]
    relays = psutil.Process().children()
    assert relays and all("bulk_relay.py" in " ".join(p.cmdline()) for p in relays)
    for relay in relays:
        relay.kill()
        relay.wait(10)
    assert bytes(reader.read(access, "", PIECE, 3 * PIECE)) == whole[PIECE:3 * PIECE]
    replaced = [p for p in psutil.Process().children() if p.pid not in {r.pid for r in relays}]
    assert replaced
    del reader
    gc.collect()
    _, alive = psutil.wait_procs(replaced, timeout=10)
    assert not alive, alive


def test_a_node_whose_relays_cannot_start_reads_on_the_data_port(head: Head, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    import sys

    import farm.data.locations.head as located

    np.save(tmp_path / "big.npy", np.random.default_rng(5).integers(0, 255, 2 * BLOCK, dtype=np.uint8))
    located.bulk.cache_clear()  # no relay kept from another test's reads
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python-here"))
    fs = HeadFileSystem(bulk_job(head, "j-10", tmp_path / "big.npy"), streams=4)
    assert fs.cat_file("") == (tmp_path / "big.npy").read_bytes()
    assert fs.bulk is None and "a relay to the head's bulk port did not start" in caplog.text
