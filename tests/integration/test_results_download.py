"""Results read from a head as a remote user reads them (TLS, the API token): streamed as Arrow batches, downloaded
by `farm results` into a folder, and a download broken off resumes at the byte where it stopped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from farm.cli.main import app
from farm.client import results as client_results
from farm.core.dataset import ROW_ID
from farm.core.errors import AuthError
from farm.data.batches import output_column
from farm.data.results import MANIFEST, Results, shard_file
from farm.head.store import Store
from tests.integration.inprocess_head import Head, running_head

ROWS = 40_000  # per shard: random float32 vectors of 8, ~1.3 MB of Parquet, over a chunk (1 MiB) each


@pytest.fixture()
def head(tmp_path: Path):  # type: ignore[no-untyped-def]
    with running_head(tmp_path / "state") as head:
        yield head


def finished_job(head: Head, tmp_path: Path, shards: int = 3, done: int | None = None) -> tuple[str, np.ndarray]:
    """A job whose `done` first shards have written their results, as the dispatcher writes them."""
    output = tmp_path / "out"
    outputs = np.random.default_rng(0).random((shards * ROWS, 8), dtype=np.float32)
    store = Store(head.db)
    store.add_job("j-r", "r", "inference", "name: r", "", str(output), shards * ROWS,
                  [(i * ROWS, (i + 1) * ROWS) for i in range(shards)])
    results = Results(str(output))
    for index in range(shards if done is None else done):
        rows = slice(index * ROWS, (index + 1) * ROWS)
        results.write_table(index, pa.table({ROW_ID: pa.array(range(rows.start, rows.stop), pa.int64()),
                                             "name": [f"r{i}" for i in range(rows.start, rows.stop)],
                                             "output": output_column(outputs[rows])}))
        store.shard_started("j-r", index, store.nodes()[0] if store.nodes() else _node(store), "cpu", "cpu", "")
        store.shard_succeeded("j-r", index, ROWS, 1.0, None, None, 0)
    if done is None:
        results.write_manifest({"job_id": "j-r", "shards": shards})
    store.close()
    return "j-r", outputs


def _node(store: Store):  # type: ignore[no-untyped-def]
    from tests.integration.inprocess_head import HW

    store.upsert_node("n-1", "box", HW, [], "", "h")
    return store.nodes()[0]


def test_results_stream_as_arrow_batches_in_row_order(head: Head, tmp_path: Path) -> None:
    job_id, outputs = finished_job(head, tmp_path)
    with head.client() as client:
        batches = list(client.results(job_id))
        assert all(isinstance(b, pa.RecordBatch) for b in batches)
        table = client.results(job_id).to_table()
    assert table.column(ROW_ID).to_pylist() == list(range(3 * ROWS))
    assert np.array_equal(np.stack(table.column("output").to_numpy(zero_copy_only=False)), outputs)
    with head.client(token="wrong") as client, pytest.raises(AuthError):
        list(client.results(job_id))


def test_a_broken_download_resumes_where_it_stopped(head: Head, tmp_path: Path) -> None:
    job_id, outputs = finished_job(head, tmp_path)
    out = tmp_path / "fetched"

    class Broken(Exception):
        pass

    def break_mid_second_file(done: int, total: int) -> None:
        if len(list(out.glob("shard-*.parquet"))) == 1 and list(out.glob(".shard-00001.parquet.part")):
            raise Broken  # the connection drops after the second file's first chunk

    with head.client() as client:
        with pytest.raises(Broken):
            client_results.download(client, job_id, out, break_mid_second_file)
        partial = (out / ".shard-00001.parquet.part").stat().st_size
        assert 0 < partial < (tmp_path / "out" / shard_file(1)).stat().st_size
        whole = sum(p.stat().st_size for p in out.iterdir() if not p.name.startswith("."))
        again = client_results.download(client, job_id, out)
    sizes = {p.name: p.stat().st_size for p in (tmp_path / "out").iterdir()}
    assert again.state == "queued" and again.total == sum(sizes.values())
    assert again.fetched == again.total - whole - partial  # nothing fetched twice
    assert sorted(p.name for p in out.iterdir()) == sorted(sizes)  # no .part left
    for name in sizes:
        assert (out / name).read_bytes() == (tmp_path / "out" / name).read_bytes()


def test_farm_results_from_a_head_on_another_machine(head: Head, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """The CLI with --head, the API token and the head's CA, from another state folder (as on another machine)."""
    job_id, outputs = finished_job(head, tmp_path, done=2)  # still running: the two shards done so far
    (tmp_path / "ca.pem").write_bytes(head.ca_pem)
    monkeypatch.setenv("FARM_CA", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("FARM_STATE_DIR", str(tmp_path / "elsewhere"))
    (tmp_path / "token").write_text(head.tokens.api)
    (tmp_path / "token").chmod(0o600)  # private, as a token file should be: no warning in the output
    runner = CliRunner()
    base = ["results", job_id, "--head", head.settings.address, "--token-file", str(tmp_path / "token")]
    fetched = runner.invoke(app, [*base, "--out", str(tmp_path / "a"), "--format", "npy", "--json"])
    assert fetched.exit_code == 0, fetched.output
    reply = json.loads(fetched.output)
    assert reply["state"] == "queued" and reply["shards"] == 2
    assert np.array_equal(np.load(tmp_path / "a" / "results.npy"), outputs[: 2 * ROWS])
    assert np.load(tmp_path / "a" / "row_ids.npy").tolist() == list(range(2 * ROWS))
    # The passthrough column too, in row order (strings as a fixed-width array: never pickled); no Parquet beside.
    assert np.load(tmp_path / "a" / "name.npy")[[0, -1]].tolist() == ["r0", f"r{2 * ROWS - 1}"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["name.npy", "results.npy", "row_ids.npy"]
    as_jsonl = runner.invoke(app, [*base, "--out", str(tmp_path / "b"), "--format", "jsonl"])
    assert as_jsonl.exit_code == 0, as_jsonl.output
    first = json.loads((tmp_path / "b" / "results.jsonl").open().readline())
    assert first["row_id"] == 0 and first["name"] == "r0" and len(first["output"]) == 8
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["results.jsonl"]  # not the Parquet files as well
    assert sum(1 for _ in (tmp_path / "b" / "results.jsonl").open()) == 2 * ROWS
    as_parquet = runner.invoke(app, [*base, "--out", str(tmp_path / "c")])
    assert as_parquet.exit_code == 0, as_parquet.output
    assert not (tmp_path / "c" / MANIFEST).exists()  # the job has not ended
    assert pq.read_table(tmp_path / "c" / shard_file(1)).num_rows == ROWS
    (tmp_path / "wrong").write_text("wrong")
    refused = runner.invoke(app, ["results", job_id, "--head", head.settings.address, "--token-file",
                                  str(tmp_path / "wrong")])
    assert isinstance(refused.exception, AuthError)  # main() makes it one line and exit code 2
