"""Which way a node reads a shard's data (farm.data.reach): itself where it can reach the data (http(s), an S3
bucket, a path of the head's that it sees as the head planned it), else through the head; and how that is reported
(the shard's figures, the job's shards, `farm job --explain`). The bucket is moto's S3 server on 127.0.0.1 (a
stand-in for a real bucket, tests.servers), the web server a real one on 127.0.0.1."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem
from pydantic import ValidationError

from farm import data
from farm.core.dataset import READ_ROUTE, DatasetSpec, ReadRoute
from farm.core.tasks import HeadAccess
from farm.data.locations.head import HeadFileSystem
from farm.data.locations.shared import SAMPLE
from tests.servers import new_bucket, s3_environment, serve_http
from tests.unit.test_data_formats import read_all

# A node's way to the head: the route is chosen without a call, so no head need listen here.
ACCESS = HeadAccess(address="127.0.0.1:9", ca_pem=b"", job_id="j-1", token="t")


def parquet_folder(folder: Path, files: int = 3, rows: int = 10) -> Path:
    folder.mkdir()
    for i in range(files):
        pq.write_table(pa.table({"x": np.arange(i * rows, (i + 1) * rows, dtype=np.float32)}),
                       folder / f"part-{i}.parquet")
    return folder


def test_a_path_on_the_head_is_read_through_the_head_where_the_spec_says_shared_false(tmp_path: Path) -> None:
    """Even where the node sees the very files (here: the same machine), `shared: false` sends it through the head."""
    folder = parquet_folder(tmp_path / "d")
    plan = data.plan(DatasetSpec(location=str(folder), format="parquet", shared=False))
    assert not plan.shared and all(f.stamp is None for f in plan.files)
    way = data.reach(plan, ACCESS)
    assert way.route is ReadRoute.HEAD and isinstance(way.fs, HeadFileSystem) and not way.why


@pytest.mark.parametrize("shared", [None, True])
def test_a_path_seen_as_planned_is_read_directly(tmp_path: Path, shared: bool | None) -> None:
    """A node on the head's machine, or one that mounts the same filesystem, reads the files itself: with no word in
    the spec (on an H100, a million Parquet rows took 3.05 s through the head, 1.23 s read so)."""
    folder = parquet_folder(tmp_path / "d")
    plan = data.plan(DatasetSpec(location=str(folder), format="parquet", shared=shared))
    assert plan.shared and all(f.stamp and f.stamp.size == (folder / f.path).stat().st_size for f in plan.files)
    way = data.reach(plan.slice(10, 30), ACCESS)
    assert way.route is ReadRoute.DIRECT and isinstance(way.fs, LocalFileSystem)
    table = pa.Table.from_batches(list(data.read(plan, 10, 30, ["x"], fs=way.fs, root=way.root)))
    assert table.column("x").to_pylist() == list(range(10, 30))


@pytest.mark.parametrize("change", ["rewritten", "touched", "gone", "unreadable"])
def test_a_path_that_differs_on_the_node_is_read_through_the_head(tmp_path: Path, change: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Another filesystem mounted there, a file changed since planning, none there, or one this node's account may
    not open: through the head, saying which file differed."""
    folder = parquet_folder(tmp_path / "d")
    plan = data.plan(DatasetSpec(location=str(folder), format="parquet"))
    victim = folder / "part-2.parquet"
    if change == "rewritten":
        pq.write_table(pa.table({"x": np.arange(11, dtype=np.float32)}), victim)
    elif change == "touched":
        stat = victim.stat()
        os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    elif change == "unreadable":
        real = os.access
        monkeypatch.setattr("farm.data.locations.shared.os.access",
                            lambda path, mode: real(path, mode) and Path(path) != victim)
    else:
        victim.unlink()
    way = data.reach(plan, ACCESS)
    assert way.route is ReadRoute.FALLBACK and isinstance(way.fs, HeadFileSystem)
    assert str(victim) in way.why and "\n" not in way.why


def test_a_node_compares_a_bounded_sample_first_and_last_among_them(tmp_path: Path) -> None:
    folder = parquet_folder(tmp_path / "d", files=40, rows=1)
    plan = data.plan(DatasetSpec(location=str(folder), format="parquet"))
    seen: list[str] = []
    real = os.stat
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("farm.data.locations.shared.os.stat", lambda path: seen.append(path) or real(path))
        assert data.reach(plan, ACCESS).route is ReadRoute.DIRECT
    assert len(seen) <= SAMPLE + 1
    assert seen[0].endswith(plan.files[0].path) and seen[-1].endswith(plan.files[-1].path)


def test_the_head_stamps_a_bounded_spread_of_files_and_a_shard_with_none_reads_through_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stamping each of 65,536 images took planning from 0.4 s to 0.9 s: the head stamps STAMPED files at most,
    evenly spread, the last among them; a node compares the stamped ones among its shard's files."""
    monkeypatch.setattr("farm.data.locations.shared.STAMPED", 4)
    folder = parquet_folder(tmp_path / "d", files=40, rows=1)
    plan = data.plan(DatasetSpec(location=str(folder), format="parquet"))
    stamped = [i for i, f in enumerate(plan.files) if f.stamp is not None]
    assert stamped == [0, 10, 20, 30, 39]
    assert data.reach(plan.slice(5, 25), ACCESS).route is ReadRoute.DIRECT  # files 10 and 20 compared
    unstamped = data.reach(plan.slice(1, 9), ACCESS)
    assert unstamped.route is ReadRoute.FALLBACK and "holds no stamp" in unstamped.why


def test_an_s3_dataset_is_read_by_the_node_itself(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    for key, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    bucket = new_bucket()
    import boto3

    folder = parquet_folder(tmp_path / "d")
    for path in sorted(folder.iterdir()):
        boto3.client("s3").upload_file(str(path), bucket, f"d/{path.name}")
    plan = data.plan(DatasetSpec(location=f"s3://{bucket}/d/", format="parquet"))
    way = data.reach(plan, ACCESS)
    assert way.route is ReadRoute.DIRECT and type(way.fs).__name__ == "S3FileSystem"
    table = pa.Table.from_batches(list(data.read(plan, 5, 25, ["x"], fs=way.fs, root=way.root)))
    assert table.column("x").to_pylist() == list(range(5, 25))


def test_an_http_dataset_is_read_by_the_node_itself(tmp_path: Path) -> None:
    parquet_folder(tmp_path / "d")
    with serve_http(tmp_path / "d") as url:
        plan = data.plan(DatasetSpec(location=f"{url}/part-1.parquet"))
        way = data.reach(plan, ACCESS)
        assert way.route is ReadRoute.DIRECT and type(way.fs).__name__ == "HTTPFileSystem"
        assert read_all(plan, [0, 10], ["x"]).column("x").to_pylist() == list(range(10, 20))


@pytest.mark.parametrize("shared", [True, False])
def test_shared_is_for_a_path(shared: bool) -> None:
    with pytest.raises(ValidationError, match="shared: is for a path"):
        DatasetSpec(location="s3://b/d/", format="parquet", shared=shared)
    assert DatasetSpec(location="s3://b/d/", format="parquet").shared is None


def test_a_reported_route_is_read_only_when_it_is_one() -> None:
    assert ReadRoute.of({READ_ROUTE: 1.0}) is ReadRoute.DIRECT
    assert ReadRoute.of({READ_ROUTE: 2.0}) is ReadRoute.FALLBACK
    assert ReadRoute.of({READ_ROUTE: 1.5}) is None and ReadRoute.of({READ_ROUTE: 7.0}) is None
    assert ReadRoute.of({}) is None


def test_explain_says_per_node_which_way_its_data_came() -> None:
    from farm.cli.render import read_routes
    from farm.core.models import Shard
    from farm.head.servicers import job_to_pb
    from farm.head.store import Job

    shards = [Shard(index=i, start=i, stop=i + 1, node_name=node, metrics={READ_ROUTE: float(route)} if route else {})
              for i, (node, route) in enumerate([("a", ReadRoute.DIRECT), ("a", ReadRoute.DIRECT),
                                                 ("b", ReadRoute.FALLBACK), ("b", ReadRoute.DIRECT), ("c", None)])]
    record = job_to_pb(Job(id="j", name="n", kind="inference", state="running", spec_yaml="", code_path="",
                           output="", items=5, model_key="", model_bytes=0, error="", explanation="", metrics={},
                           created_at=0.0, started_at=0.0, finished_at=0.0, shards=tuple(shards), correct=None))
    assert [s.read_route for s in record.shards] == ["direct", "direct", "fallback", "direct", ""]
    lines = read_routes(record)
    assert lines[0] == "a: 2 shards read directly"
    assert lines[1].startswith("b: 1 shard read directly, 1 shard read through the head (it does not see the path")
    assert len(lines) == 2


def test_a_shard_read_ahead_reports_the_route_its_reader_took(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """A worker's next shard is read from before it starts: its rows came the way its reader reached the files then,
    and that is the route it reports, even where the files changed before the shard itself began."""
    from farm.core.tasks import DataTask, ShardTask
    from farm_agent.work.kinds import inference
    from farm_agent.work.kinds.inference import AHEAD

    folder = parquet_folder(tmp_path / "d")
    spec = DatasetSpec(location=str(folder), format="parquet", inputs=["x"], shared=True)
    plan = data.plan(spec)
    task = ShardTask(job_id="j", index=0, start=0, stop=30, model="torch.nn:Identity",
                     weights=None, dataset="", batch_size=8, backend="cpu", device="cpu", threads=1,
                     data=DataTask(spec=spec, plan=plan, access=ACCESS))
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the job's code: this repository
    inference.read_ahead(task, "t-1")
    held = AHEAD.take("t-1")
    assert held is not None
    for file in folder.iterdir():  # changed after the reader began: a reach now would go through the head
        os.utime(file, ns=(1, 1))
    assert data.reach(plan, ACCESS).route is ReadRoute.FALLBACK
    tables: list[pa.Table] = []
    result = inference.run_shard(task, tables.append, ahead=held[0], way=held[1])
    assert result.read_route is ReadRoute.DIRECT and sum(t.num_rows for t in tables) == 30
