"""The shard runner streaming a located dataset on this machine (no Ray: the function a node's worker runs): its
rows through the preprocess and a real model, batch by batch, into a results table of row_id, passthrough columns and
outputs; a malformed input fails the shard naming its file and row; the old callable datasets still work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm import data
from farm.core.dataset import ROW_ID, DatasetSpec
from farm.core.errors import DataError
from farm.core.tasks import DataTask, ShardTask
from farm.data.batches import column_to_numpy, from_ipc
from farm_agent.runner import run_shard

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture()
def digits(tmp_path: Path) -> Path:
    from examples.datasets.make import write

    write(tmp_path)
    return tmp_path


def task(spec: DatasetSpec, start: int, stop: int, batch_size: int = 64) -> ShardTask:
    plan = data.plan(spec)
    return ShardTask(job_id="j", index=0, start=start, stop=stop, model="examples.digits.model:build",
                     weights="examples/digits/weights.pt", dataset="", batch_size=batch_size, backend="cpu",
                     device="cpu", threads=1, data=DataTask(spec=spec, plan=plan.slice(start, stop)))


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES.parent)  # the job's code is the working directory, as Ray makes it


def test_a_parquet_range_streams_through_preprocess_and_model(digits: Path) -> None:
    spec = DatasetSpec(location=str(digits / "digits-parquet"), format="parquet", inputs=["pixels"],
                       passthrough=["index"], label="label", preprocess="examples.datasets.prep:pixels")
    result = run_shard(task(spec, 100, 300, batch_size=48))
    table = from_ipc(result.table)
    assert table.column_names == [ROW_ID, "index", "output"]
    assert table.column(ROW_ID).to_pylist() == list(range(100, 300)) == table.column("index").to_pylist()
    assert result.items == 200 and result.correct is not None and result.correct / 200 > 0.9
    outputs = column_to_numpy(table.column("output"), "output", list(range(200)), "")
    from examples.digits.data import test_set
    from farm_agent.jobcode import load_model

    import torch

    model = load_model("examples.digits.model:build", "examples/digits/weights.pt", EXAMPLES.parent)
    with torch.inference_mode():
        expected = model(torch.from_numpy(test_set()[0][100:300])).numpy()
    np.testing.assert_allclose(outputs, expected, rtol=1e-4, atol=1e-4)
    assert pa.types.is_fixed_size_list(table.schema.field("output").type)


def test_an_image_folder_range_is_decoded_on_the_node(digits: Path) -> None:
    spec = DatasetSpec(location=str(digits / "digits-images"), format="images", passthrough=["path"],
                       preprocess="examples.datasets.prep:images")
    table = from_ipc(run_shard(task(spec, 0, 70)).table)
    assert table.column("path").to_pylist()[:2] == ["000-1.png", "001-4.png"]
    labels = [int(p.split("-")[1].removesuffix(".png")) for p in table.column("path").to_pylist()]
    predicted = column_to_numpy(table.column("output"), "output", [], "").argmax(axis=1)
    assert (predicted == np.array(labels)).mean() > 0.9


def test_an_image_that_does_not_decode_fails_its_shard_only(digits: Path) -> None:
    victim = next((digits / "digits-images").glob("050-*.png"))
    victim.write_bytes(b"not a png")
    spec = DatasetSpec(location=str(digits / "digits-images"), format="images",
                       preprocess="examples.datasets.prep:images")
    assert from_ipc(run_shard(task(spec, 0, 50)).table).num_rows == 50  # the shard before it
    with pytest.raises(DataError, match=rf"digits-images/{victim.name} \(row 50\): the image does not decode"):
        run_shard(task(spec, 50, 100))


def test_a_bad_row_fails_its_shard_naming_file_and_row(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text("".join(
        '{"x": [1.0, 2.0]}\n' if i != 7 else '{"x": [1.0]}\n' for i in range(20)))
    spec = DatasetSpec(location=str(tmp_path / "d.jsonl"), inputs=["x"])
    shard = task(spec, 0, 10_000)
    shard = ShardTask(**{**shard.__dict__, "model": "tests.unit.test_stream_runner:linear", "weights": None})
    with pytest.raises(DataError, match=r"d\.jsonl \(row 126\): column 'x' holds \(1,\) where the rows before"):
        run_shard(shard)


def linear():  # type: ignore[no-untyped-def]
    import torch

    return torch.nn.Linear(2, 1)


def test_a_callable_dataset_still_works() -> None:
    shard = ShardTask(job_id="j", index=0, start=10, stop=30, model="examples.digits.model:build",
                      weights="examples/digits/weights.pt", dataset="examples.digits.data:test_set", batch_size=8,
                      backend="cpu", device="cpu", threads=1)
    result = run_shard(shard)
    table = from_ipc(result.table)
    assert table.column(ROW_ID).to_pylist() == list(range(10, 30)) and result.correct is not None
    assert column_to_numpy(table.column("output"), "output", [], "").shape == (20, 10)
