"""The data plane end to end on the shared cluster (a real head, Ray and two agents): the digits as a Parquet folder
and as an image folder on the head's machine, read by the agents through the head's DataService (`shared: false`)
or themselves, results as Parquet fetched by `farm results`; an image that does not decode fails its own shard, and
the job's other shards finish."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from farm.data.results import read_predictions
from tests.conftest import ROOT, Cluster, farm
from tests.servers import new_bucket, serve_http

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from examples.datasets.make import write

    folder = tmp_path_factory.mktemp("digits-data")
    write(folder)
    return folder


def submit(cluster: Cluster, tmp_path: Path, name: str, dataset: dict[str, object], shards: int = 4,
           output: str | None = None, **more: object) -> dict[str, object]:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name, "model": "examples.digits.model:build", "weights": "examples/digits/weights.pt",
        "dataset": dataset, "shards": shards, "batch_size": 64, "backends": ["cpu"],
        "output": output or str(tmp_path / name), **more}))
    done = cluster.farm("submit", str(spec), "--wait", "--json", "--workdir", str(ROOT))
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


def shard_rows(folder: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(path) for path in sorted(folder.glob("shard-*.parquet")))


def expected_predictions() -> np.ndarray:
    """The digits model over the digits, in this process."""
    import torch

    from examples.digits.data import test_set
    from farm_agent.work.jobcode import build_model

    with torch.inference_mode():
        return build_model("examples.digits.model:build", "examples/digits/weights.pt", ROOT)(
            torch.from_numpy(test_set()[0])).numpy()


def test_a_parquet_folder_job_and_its_results_from_elsewhere(cluster: Cluster, digits: Path, tmp_path: Path
                                                             ) -> None:
    job = submit(cluster, tmp_path, "pq", {
        "location": str(digits / "digits-parquet"), "format": "parquet", "inputs": "pixels", "passthrough": ["index"],
        "label": "label", "preprocess": "examples.datasets.prep:pixels", "shared": False})
    assert job["state"] == "succeeded" and job["items"] == 540, job.get("error")
    assert job["metrics"]["accuracy"] >= 0.9 and {s["node_name"] for s in job["shards"]} == {"agent-a", "agent-b"}
    output = Path(str(job["output"]))
    assert sorted(p.name for p in output.iterdir()) == ["_manifest.json", *(f"shard-{i:05d}.parquet" for i in range(4))]
    assert json.loads((output / "_manifest.json").read_text())["format"] == "parquet"
    np.testing.assert_allclose(read_predictions(output), expected_predictions(), rtol=1e-4, atol=1e-4)

    explained = farm("job", str(job["id"]), "--explain", env={**cluster.env(), "COLUMNS": "400"})
    assert "preprocess examples.datasets.prep:pixels runs on the nodes inside the energy window" in explained.stdout
    for node, count in Counter(s["node_name"] for s in job["shards"]).items():  # a head path, `shared: false`
        assert f"{node}: {count} shard{'s' if count > 1 else ''} read through the head" in explained.stdout
        # where its shards' time went, as each node measured it and the head bounded it
        assert re.search(rf"{node}/cpu: {count} shards?, [\d.]+ s measured: the model \d+ %, waiting for input \d+ %",
                         explained.stdout), explained.stdout

    # From another state folder, as on another machine: the head's address, its API token and its CA.
    head = cluster.head
    ca = tmp_path / "ca.pem"
    ca.write_bytes(head.ca_pem or b"")
    fetched = farm("results", str(job["id"]), "--head", head.address, "--token", head.api_token, "--out",
                   str(tmp_path / "fetched"), "--format", "jsonl",
                   env={"FARM_STATE_DIR": str(tmp_path / "elsewhere"), "FARM_CA": str(ca)})
    assert fetched.returncode == 0, fetched.stderr
    rows = [json.loads(line) for line in (tmp_path / "fetched" / "results.jsonl").read_text().splitlines()]
    assert [r["row_id"] for r in rows] == list(range(540)) == [r["index"] for r in rows]


def test_a_folder_the_nodes_see_as_planned_is_read_by_them(cluster: Cluster, digits: Path, tmp_path: Path) -> None:
    """A path of the head's machine, which the agents see at the same place (they run on that machine): read from
    their own filesystem with no word in the spec, and `farm job --explain` says so per node."""
    job = submit(cluster, tmp_path, "shared", {
        "location": str(digits / "digits-parquet"), "format": "parquet", "inputs": "pixels", "passthrough": ["index"],
        "preprocess": "examples.datasets.prep:pixels"})
    assert job["state"] == "succeeded" and job["items"] == 540, job.get("error")
    assert {s["read_route"] for s in job["shards"]} == {"direct"}
    np.testing.assert_allclose(read_predictions(Path(str(job["output"]))), expected_predictions(), rtol=1e-4,
                               atol=1e-4)
    explained = farm("job", str(job["id"]), "--explain", env={**cluster.env(), "COLUMNS": "400"})
    assert "a node that sees its files at that path as planned" in explained.stdout
    for node, count in Counter(s["node_name"] for s in job["shards"]).items():
        assert f"{node}: {count} shard{'s' if count > 1 else ''} read directly\n" in explained.stdout
    assert "read through the head" not in explained.stdout


def test_an_image_that_does_not_decode_is_skipped_alone_and_its_shards_other_rows_complete(
        cluster: Cluster, digits: Path, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    for path in sorted((digits / "digits-images").iterdir())[:256]:
        images.joinpath(path.name).write_bytes(path.read_bytes())
    victim = sorted(images.iterdir())[200]
    victim.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    job = submit(cluster, tmp_path, "img", {"location": str(images), "format": "images", "passthrough": ["path"],
                                            "preprocess": "examples.datasets.prep:images"})
    assert job["state"] == "failed"  # the error budget is 0 by default
    # Rows 192-255 held the bad one: the shard keeps row 200 alone, failed; 192-199 and 201-255 ran again.
    ranges = [(s["start"], s["stop"], s["state"]) for s in job["shards"]]
    assert ranges[3:] == [(200, 201, "failed"), (192, 200, "succeeded"), (201, 256, "succeeded")]
    error = job["shards"][3]["error"]
    assert f"images/{victim.name} (row 200): the image does not decode" in error and "\n" not in error
    assert str(job["error"]).startswith("1 row of 256 do not read (1 range), over the job's error budget of 0")
    output = Path(str(job["output"]))
    assert sorted(p.name for p in output.iterdir()) == [f"shard-{i:05d}.parquet" for i in (0, 1, 2, 4, 5)]
    assert sorted(shard_rows(output).column("row_id").to_pylist()) == [r for r in range(256) if r != 200]


def test_a_corrupt_row_group_within_the_error_budget_is_skipped_and_listed(cluster: Cluster, digits: Path,
                                                                          tmp_path: Path) -> None:
    """Issue 31: one bad row group of one file lost a three-file shard's good rows; now only its rows are skipped."""
    folder = tmp_path / "parquet"
    folder.mkdir()
    table = pa.concat_tables(pq.read_table(p) for p in sorted((digits / "digits-parquet").glob("*.parquet")))
    pq.write_table(table, folder / "all.parquet", row_group_size=60)
    corrupt_row_group(folder / "all.parquet", 3)  # rows 180-239
    job = submit(cluster, tmp_path, "rg", {"location": str(folder), "format": "parquet", "inputs": "pixels",
                                           "passthrough": ["index"], "preprocess": "examples.datasets.prep:pixels"},
                 shards=2, max_bad_rows=60)
    assert job["state"] == "succeeded", job.get("error")
    manifest = json.loads((Path(str(job["output"])) / "_manifest.json").read_text())
    (skipped,) = manifest["skipped"]
    assert (skipped["start"], skipped["stop"]) == (180, 240) and "rows 180-239 (row group 3) do not read" in \
        skipped["error"]
    ids = shard_rows(Path(str(job["output"]))).column("row_id").to_pylist()
    assert sorted(ids) == [r for r in range(540) if not 180 <= r < 240]


def corrupt_row_group(path: Path, group: int) -> None:
    """Overwrite bytes inside one row group's first data page, as a bad sector would: the footer still reads."""
    chunk = pq.read_metadata(path).row_group(group).column(0)
    raw = bytearray(path.read_bytes())
    raw[chunk.data_page_offset + 40:chunk.data_page_offset + 80] = b"\xff\x13" * 20
    path.write_bytes(bytes(raw))


def test_jobs_over_a_bucket_and_a_web_server_with_results_in_the_bucket(cluster: Cluster, digits: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The two other locations on the real cluster: a Parquet folder in an S3 bucket (moto's server on loopback, a
    stand-in for a real bucket; the agents read it themselves, with the credentials in their own environment) with
    the results written to the bucket by the head; and one Parquet file on a web server, read by ranged GETs."""
    for key, value in cluster.s3.items():
        monkeypatch.setenv(key, value)
    bucket = new_bucket()
    import boto3

    client = boto3.client("s3")
    for path in sorted((digits / "digits-parquet").iterdir()):
        client.upload_file(str(path), bucket, f"digits/{path.name}")
    parquet = {"format": "parquet", "inputs": "pixels", "label": "label", "passthrough": ["index"],
               "preprocess": "examples.datasets.prep:pixels"}
    job = submit(cluster, tmp_path, "bucket", {"location": f"s3://{bucket}/digits/", **parquet}, shards=3,
                 output=f"s3://{bucket}/out/bucket")
    assert job["state"] == "succeeded" and job["items"] == 540, job.get("error")
    assert job["metrics"]["accuracy"] >= 0.9
    assert {s["read_route"] for s in job["shards"]} == {"direct"}  # the agents read the bucket themselves
    assert sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]) == [
        "out/bucket/_manifest.json", *(f"out/bucket/shard-{i:05d}.parquet" for i in range(3))]
    expected = expected_predictions()
    np.testing.assert_allclose(read_predictions(f"s3://{bucket}/out/bucket"), expected, rtol=1e-4, atol=1e-4)
    fetched = cluster.farm("results", str(job["id"]), "--out", str(tmp_path / "fetched"))
    assert fetched.returncode == 0, fetched.stderr
    assert shard_rows(tmp_path / "fetched").column("index").to_pylist() == list(range(540))

    with serve_http(digits / "digits-parquet") as url:
        job = submit(cluster, tmp_path, "web", {"location": f"{url}/part-1.parquet", **parquet}, shards=2)
    assert job["state"] == "succeeded" and job["items"] == 180, job.get("error")
    assert shard_rows(Path(str(job["output"]))).column("index").to_pylist() == list(range(180, 360))
    np.testing.assert_allclose(read_predictions(Path(str(job["output"]))), expected[180:360], rtol=1e-4, atol=1e-4)
