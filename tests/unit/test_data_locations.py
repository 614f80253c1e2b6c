"""Datasets and results at the locations Farm reads besides the head's own disk: an http(s) URL (a real HTTP server on
127.0.0.1, serving ranged GETs) and an S3 bucket. The S3 bucket is moto's S3 server on 127.0.0.1: a stand-in for a
real bucket (AWS, MinIO, R2), reached through the same s3fs client and credentials from the environment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm import data
from farm.core.dataset import ROW_ID, DatasetSpec
from farm.data.results import MANIFEST, Results, read_predictions, shard_file

from tests.servers import RangeHandler, new_bucket, s3_environment, serve_http
from tests.unit.test_data_formats import read_all


@pytest.fixture()
def http_root(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    with serve_http(tmp_path) as url:
        yield url, tmp_path


def test_an_http_parquet_file_is_read_by_ranges(http_root: tuple[str, Path]) -> None:
    url, folder = http_root
    pq.write_table(pa.table({"x": np.arange(1000, dtype=np.float32)}), folder / "d.parquet", row_group_size=100)
    RangeHandler.ranges = []
    plan = data.plan(DatasetSpec(location=f"{url}/d.parquet", inputs=["x"]))
    assert plan.rows == 1000
    table = read_all(plan, [250, 420], ["x"])
    assert table.column("x").to_pylist() == list(range(250, 420))
    assert RangeHandler.ranges  # ranged GETs, not the whole file


def test_an_http_jsonl_file(http_root: tuple[str, Path]) -> None:
    url, folder = http_root
    (folder / "d.jsonl").write_text("".join(json.dumps({"x": i}) + "\n" for i in range(300)))
    plan = data.plan(DatasetSpec(location=f"{url}/d.jsonl", inputs=["x"]))
    table = read_all(plan, [0, 1000, plan.size])
    assert table.column("x").to_pylist() == list(range(300))


@pytest.fixture()
def bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; the credentials and the endpoint only in the environment, as Farm expects them."""
    for key, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    return new_bucket()


def test_an_s3_parquet_folder(bucket: str, tmp_path: Path) -> None:
    import boto3

    s3 = boto3.client("s3")
    for i in range(3):
        pq.write_table(pa.table({"x": np.arange(i * 100, i * 100 + 100)}), tmp_path / f"{i}.parquet",
                       row_group_size=30)
        s3.upload_file(str(tmp_path / f"{i}.parquet"), bucket, f"data/part-{i}.parquet")
    spec = DatasetSpec(location=f"s3://{bucket}/data/", format="parquet", inputs=["x"])
    assert "testing" not in spec.model_dump_json()  # the spec names the bucket, never a credential
    plan = data.plan(spec)
    assert plan.rows == 300 and [f.path for f in plan.files] == [f"part-{i}.parquet" for i in range(3)]
    table = read_all(plan, [0, 77, 150, 299, 300], ["x"])
    assert table.column("x").to_pylist() == list(range(300))


def test_an_s3_text_file_and_image_folder(bucket: str, tmp_path: Path) -> None:
    import boto3
    from PIL import Image

    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key="lines.txt", Body="".join(f"line {i}\n" for i in range(50)).encode())
    plan = data.plan(DatasetSpec(location=f"s3://{bucket}/lines.txt"))
    assert read_all(plan, [0, 100, plan.size]).column("text").to_pylist() == [f"line {i}" for i in range(50)]
    for i in range(5):
        Image.fromarray(np.full((3, 3), i, np.uint8)).save(tmp_path / f"{i}.png")
        s3.upload_file(str(tmp_path / f"{i}.png"), bucket, f"imgs/{i}.png")
    plan = data.plan(DatasetSpec(location=f"s3://{bucket}/imgs", format="images"))
    assert plan.rows == 5
    from farm.data.batches import numpy_batch

    batch = next(data.read(plan, 1, 4, None, 8))
    assert numpy_batch(batch, ["image"], plan.format, plan.location)["image"][:, 0, 0].tolist() == [1, 2, 3]


def test_results_in_a_bucket(bucket: str) -> None:
    results = Results(f"s3://{bucket}/out/job")
    for index in range(2):
        table = pa.table({ROW_ID: pa.array([2 * index, 2 * index + 1], pa.int64()),
                          "output": pa.array([float(index)] * 2)})
        staged = results.staging(index)  # a shard's table arrives in a local file, then goes up in one PUT
        pq.write_table(table, staged)
        results.commit_shard(index, staged)
        assert not staged.exists()
    results.write_manifest({"shards": 2})
    assert [name for name, _ in results.files()] == [MANIFEST, shard_file(0), shard_file(1)]
    assert read_predictions(f"s3://{bucket}/out/job").tolist() == [0.0, 0.0, 1.0, 1.0]


def test_an_inference_job_writes_its_results_and_manifest_to_a_bucket(bucket: str, tmp_path: Path) -> None:
    """The head's path for `output: s3://...`: a shard's result checked and written by the inference handler, the
    manifest by the one finishing path, read back as `farm results` reads a job's files."""
    from farm.core.models import BackendName, BackendOffer, Hardware
    from farm.core.spec import parse_spec
    from farm.data.batches import output_column
    from tests.uploads import arrive
    from farm.head.dispatch import Dispatcher
    from farm.head.settings import HeadSettings
    from farm.head.store import Store

    spec_yaml = f"name: b\nmodel: m:b\ndataset: d:x\nshards: 2\noutput: s3://{bucket}/out/b\n"
    assert parse_spec(spec_yaml).output == f"s3://{bucket}/out/b"
    store = Store(tmp_path / "state.db")
    hw = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="c", cpu_cores=2, memory_bytes=2**30)
    store.upsert_node("n-1", "box", hw, [BackendOffer(name=BackendName.CPU, device="cpu")], "127.0.0.1", "h")
    store.add_job("j-b", "b", "inference", spec_yaml, "/nowhere.zip", f"s3://{bucket}/out/b", 4, [(0, 2), (2, 4)])
    farm = Dispatcher(store, HeadSettings(state_dir=tmp_path), notify=lambda job_id: None)
    job = store.job("j-b")
    handler, spec = farm.handler(job), farm.spec(job)
    for shard in job.shards:
        store.shard_started(job.id, shard.index, store.nodes()[0], "cpu", "cpu")
        table = pa.table({ROW_ID: pa.array(range(shard.start, shard.stop), pa.int64()),
                          "output": output_column(np.full((2, 3), shard.index, np.float32))})
        result = arrive(handler.staging(job, shard.index), [table], items=2, seconds=0.1)
        handler.check_result(job, spec, shard, result)
        farm.outcomes.succeeded(job.id, shard.index, handler.record(job, spec, shard, result))
    assert farm.outcomes.finish_if_done(job.id, handler, spec)
    results = Results(f"s3://{bucket}/out/b")
    assert [name for name, _ in results.files()] == [MANIFEST, shard_file(0), shard_file(1)]
    assert read_predictions(f"s3://{bucket}/out/b")[:, 0].tolist() == [0.0, 0.0, 1.0, 1.0]
    with results.open(MANIFEST) as handle:
        assert json.loads(handle.read())["format"] == "parquet"


def test_a_local_folder_is_listed_as_fsspec_lists_it(tmp_path: Path) -> None:
    """find's own walk of a local folder (fsspec's stats each entry in Python): the same paths, hidden files and
    links included, a link to a folder listed as fsspec lists it (not walked into)."""
    import os

    from fsspec.implementations.local import LocalFileSystem

    from farm.data.locations import find

    (tmp_path / "d" / "a" / ".hidden").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    for path in ("d/x.png", "d/a/y.png", "d/a/.hidden/z.png", "d/.dot.png", "elsewhere/w.png"):
        (tmp_path / path).write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere", tmp_path / "d" / "linked")
    os.symlink(tmp_path / "d" / "x.png", tmp_path / "d" / "alias.png")
    fs = LocalFileSystem()
    assert sorted(find(fs, str(tmp_path / "d"))) == sorted(fs.find(str(tmp_path / "d")))
    assert str(tmp_path / "d" / "linked") in find(fs, str(tmp_path / "d"))
