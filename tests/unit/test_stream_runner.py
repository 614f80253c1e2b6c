"""The shard runner streaming a located dataset on this machine (no Ray: the function a node's worker runs): its
rows through the preprocess and a real model, batch by batch, into a results table of row_id, passthrough columns and
outputs; a malformed input fails the shard naming its file and row; the old callable datasets still work."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm import data
from farm.core.dataset import ROW_ID, DatasetSpec
from farm.core.errors import DataError
from farm.core.tasks import DataTask, ShardTask
from farm.data.batches import column_to_numpy
from tests.uploads import arrive, run_here

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
    result, table = run_here(task(spec, 100, 300, batch_size=48))
    assert table.column_names == [ROW_ID, "index", "output"]
    assert table.column(ROW_ID).to_pylist() == list(range(100, 300)) == table.column("index").to_pylist()
    assert result.items == 200 and result.correct is not None and result.correct / 200 > 0.9
    outputs = column_to_numpy(table.column("output"), "output", list(range(200)), "")
    from examples.digits.data import test_set
    from farm_agent.work.jobcode import load_model

    import torch

    model = load_model("examples.digits.model:build", "examples/digits/weights.pt", EXAMPLES.parent)
    with torch.inference_mode():
        expected = model(torch.from_numpy(test_set()[0][100:300])).numpy()
    np.testing.assert_allclose(outputs, expected, rtol=1e-4, atol=1e-4)
    assert pa.types.is_fixed_size_list(table.schema.field("output").type)


def test_an_image_folder_range_is_decoded_on_the_node(digits: Path) -> None:
    spec = DatasetSpec(location=str(digits / "digits-images"), format="images", passthrough=["path"],
                       preprocess="examples.datasets.prep:images")
    table = run_here(task(spec, 0, 70))[1]
    assert table.column("path").to_pylist()[:2] == ["000-1.png", "001-4.png"]
    labels = [int(p.split("-")[1].removesuffix(".png")) for p in table.column("path").to_pylist()]
    predicted = column_to_numpy(table.column("output"), "output", [], "").argmax(axis=1)
    assert (predicted == np.array(labels)).mean() > 0.9


def test_an_image_that_does_not_decode_fails_its_shard_only(digits: Path) -> None:
    victim = next((digits / "digits-images").glob("050-*.png"))
    victim.write_bytes(b"not a png")
    spec = DatasetSpec(location=str(digits / "digits-images"), format="images",
                       preprocess="examples.datasets.prep:images")
    assert run_here(task(spec, 0, 50))[1].num_rows == 50  # the shard before it
    with pytest.raises(DataError, match=rf"digits-images/{victim.name} \(row 50\): the image does not decode"):
        run_here(task(spec, 50, 100))


def test_a_bad_row_fails_its_shard_naming_file_and_row(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text("".join(
        '{"x": [1.0, 2.0]}\n' if i != 7 else '{"x": [1.0]}\n' for i in range(20)))
    spec = DatasetSpec(location=str(tmp_path / "d.jsonl"), inputs=["x"])
    shard = task(spec, 0, 10_000)
    shard = ShardTask(**{**shard.__dict__, "model": "tests.unit.test_stream_runner:linear", "weights": None})
    with pytest.raises(DataError, match=r"d\.jsonl \(row 126\): column 'x' holds \(1,\) where the rows before"):
        run_here(shard)


def linear():  # type: ignore[no-untyped-def]
    import torch

    return torch.nn.Linear(2, 1)


FIRST_BATCH_READ = threading.Event()
READ_WHILE_THE_MODEL_LOADED: list[bool] = []


def marking(batch: dict[str, np.ndarray]) -> np.ndarray:  # the preprocess: it runs as the reader reads a batch
    FIRST_BATCH_READ.set()
    return batch["x"].astype(np.float32)


def linear_once_read():  # type: ignore[no-untyped-def]
    import torch

    READ_WHILE_THE_MODEL_LOADED.append(FIRST_BATCH_READ.wait(3))
    return torch.nn.Linear(2, 1)


def test_the_first_batch_is_read_while_the_model_loads(tmp_path: Path) -> None:
    """A worker's first shard of a job both loads the model (its import, build, weights, the move to the device) and
    reads its first batch (an image folder's decoder processes start with it: ~0.5 s here): at once, not in turn."""
    (tmp_path / "d.jsonl").write_text('{"x": [1.0, 2.0]}\n' * 20)
    spec = DatasetSpec(location=str(tmp_path / "d.jsonl"), inputs=["x"],
                       preprocess="tests.unit.test_stream_runner:marking")
    shard = task(spec, 0, 10_000)
    shard = ShardTask(**{**shard.__dict__, "model": "tests.unit.test_stream_runner:linear_once_read", "weights": None})
    result, table = run_here(shard)
    assert result.items == 20 == table.num_rows  # type: ignore[attr-defined]
    assert READ_WHILE_THE_MODEL_LOADED == [True]


def slow_reading(batch: dict[str, np.ndarray]) -> np.ndarray:  # the preprocess: the reader's side of a batch
    time.sleep(0.03)
    return batch["x"].astype(np.float32)


def slow_linear():  # type: ignore[no-untyped-def]
    import torch

    class Slow(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.03)
            return super().forward(x)

    time.sleep(0.2)  # its loading
    return Slow(2, 1)


@pytest.mark.parametrize("slow", ["reading", "model"])
def test_a_shard_says_where_its_time_went(tmp_path: Path, slow: str) -> None:
    """Ten batches, 30 ms each on the slow side: a shard whose reading is slow waits for its input most of its
    window; one whose model is slow hardly waits, and its loading and warm-up are counted before the window."""
    from farm.core.phases import bound_by

    (tmp_path / "d.jsonl").write_text('{"x": [1.0, 2.0]}\n' * 40)
    spec = DatasetSpec(location=str(tmp_path / "d.jsonl"), inputs=["x"],
                       preprocess="tests.unit.test_stream_runner:slow_reading" if slow == "reading" else None)
    shard = task(spec, 0, 10_000, batch_size=4)
    model = "tests.unit.test_stream_runner:" + ("linear" if slow == "reading" else "slow_linear")
    result, _ = run_here(ShardTask(**{**shard.__dict__, "model": model, "weights": None}))
    phases, window = result.phases, result.seconds  # type: ignore[attr-defined]
    assert phases is not None and phases.input_wait + phases.output <= window
    if slow == "reading":
        assert phases.input_wait > window / 2 and bound_by(phases, window).startswith("its input")
    else:
        assert phases.input_wait < window / 2 and bound_by(phases, window) == "the model"
        assert phases.load >= 0.2 and phases.warm_up == 0.0  # cpu: no shape runs before the window


FORWARDS: list[int] = []


def counted_linear():  # type: ignore[no-untyped-def]
    import torch

    class Counted(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            FORWARDS.append(len(x))
            return super().forward(x)

    return Counted(2, 1)


def test_a_cpu_shard_runs_each_batch_once() -> None:
    """The CPU backend warms no batch shape up before the window (a whole batch of the model's work, again for each
    new shape, for a fraction of a batch saved): each of the shard's batches, the short last one too, runs once."""
    shard = ShardTask(job_id="j", index=0, start=0, stop=10, model="tests.unit.test_stream_runner:counted_linear",
                      weights=None, dataset="tests.unit.test_stream_runner:pairs", batch_size=4, backend="cpu",
                      device="cpu", threads=1)
    FORWARDS.clear()
    result, table = run_here(shard)
    assert table.num_rows == 10 and result.phases.warm_up == 0.0  # type: ignore[attr-defined]
    assert FORWARDS == [4, 4, 2]


def pairs() -> np.ndarray:
    return np.ones((10, 2), np.float32)


def test_a_callable_dataset_still_works() -> None:
    shard = ShardTask(job_id="j", index=0, start=10, stop=30, model="examples.digits.model:build",
                      weights="examples/digits/weights.pt", dataset="examples.digits.data:test_set", batch_size=8,
                      backend="cpu", device="cpu", threads=1)
    result, table = run_here(shard)
    assert table.column(ROW_ID).to_pylist() == list(range(10, 30)) and result.correct is not None
    assert column_to_numpy(table.column("output"), "output", [], "").shape == (20, 10)


def test_a_json_lines_job_end_to_end_in_bytes(digits: Path, tmp_path: Path) -> None:
    """The head's inference handler and the node's runner, in this process (no Ray): a JSON Lines dataset planned in
    bytes, three shards cut anywhere, each streamed, checked and written; the job's figures count rows, not bytes."""
    import dataclasses
    import io
    import json
    import zipfile

    from farm.core.models import BackendName, BackendOffer, Hardware
    from farm.core.spec import parse_spec
    from farm.data.results import read_predictions
    from farm.head import datasets
    from farm.head.dispatch import Dispatcher
    from farm.head.kinds.base import Submission
    from farm.head.settings import HeadSettings
    from farm.head.store import Store
    from farm.local import write_private
    from farm.scheduler import Assignment
    from examples.digits.data import test_set

    inputs, labels = test_set()
    lines = digits / "digits.jsonl"
    lines.write_text("".join(json.dumps({"pixels": x.reshape(-1).tolist(), "label": int(y)}) + "\n"
                             for x, y in zip(inputs, labels)))
    spec_yaml = (f"name: lines\nmodel: examples.digits.model:build\nweights: examples/digits/weights.pt\nshards: 3\n"
                 f"dataset: {{location: {lines}, inputs: pixels, label: label, "
                 "preprocess: 'examples.datasets.prep:pixels'}\n")
    settings = HeadSettings(state_dir=tmp_path / "state", insecure=True)
    store = Store(tmp_path / "state.db")
    hw = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="c", cpu_cores=2, memory_bytes=2**30)
    store.upsert_node("n-1", "box", hw, [BackendOffer(name=BackendName.CPU, device="cpu")], "127.0.0.1", "h")
    farm = Dispatcher(store, settings, notify=lambda job_id: None)
    handler, spec = farm.handlers[parse_spec(spec_yaml).kind], parse_spec(spec_yaml)
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.write(EXAMPLES / "digits" / "weights.pt", "examples/digits/weights.pt")
    plan = handler.plan(spec, Submission(code.getvalue(), frozenset({"examples/digits/weights.pt"}), 0))
    assert plan.items == lines.stat().st_size and len(plan.ranges) == 3  # bytes
    assert "preprocess examples.datasets.prep:pixels runs on the nodes inside the energy window" in plan.notes[0]
    for name, data in plan.keep.items():
        write_private(datasets.job_dir(settings.state_dir, "j-l") / name, data)
    store.add_job("j-l", "lines", "inference", spec_yaml, "/nowhere.zip", str(tmp_path / "out"), plan.items,
                  plan.ranges, plan.model_key)
    job = store.job("j-l")
    assert handler.counts_bytes(job, spec)
    for shard in job.shards:
        store.shard_started(job.id, shard.index, store.nodes()[0], "cpu", "cpu")
        placed = Assignment(job_id=job.id, index=shard.index, node_id="n-1", backend=BackendName.CPU, device="cpu",
                            threads=1, score=0.0, basis="")
        task = handler.task(job, spec, shard, placed).task
        assert task.data.access is not None and task.data.access.job_id == job.id  # a node reads via the head ...
        ran, table = run_here(dataclasses.replace(task, data=dataclasses.replace(task.data, access=None)))  # its disk
        result = arrive(handler.staging(job, shard.index), [table], items=ran.items, seconds=ran.seconds,
                        correct=ran.correct)  # as its upload arrives at the head
        handler.check_result(job, spec, shard, result)
        farm.outcomes.succeeded(job.id, shard.index, handler.record(job, spec, shard, result))
    assert farm.outcomes.finish_if_done(job.id, handler, spec)
    done = store.job("j-l")
    assert done.items_done == 540 and 0.9 < done.metrics["accuracy"] <= 1.0
    assert read_predictions(tmp_path / "out").shape == (540, 10)
