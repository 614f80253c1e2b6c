"""Between Arrow and the model at the device's speed (issue 28, item 2): images decoded on a pool of the CPUs the node
lends, and Arrow columns handed to NumPy without a copy where the layout allows."""

from __future__ import annotations

import io
import threading

import numpy as np
import pyarrow as pa
import pytest

from farm.core.dataset import ROW_ID, DataFormat
from farm.core.errors import DataError
from farm.data.batches import column_to_numpy, numpy_batch


def _png(value: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 3, 3), value, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _images(count: int) -> pa.RecordBatch:
    return pa.record_batch({ROW_ID: pa.array(range(count), pa.int64()),
                            "image": pa.array([_png(i) for i in range(count)], pa.binary()),
                            "path": pa.array([f"{i}.png" for i in range(count)])})


def test_images_decode_on_as_many_threads_as_the_node_lends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Images Pillow decodes on threads (large ones: these tiny ones only as if; small ones go to processes,
    test_data_decode_pool)."""
    from PIL import Image

    from farm.data import decoders

    monkeypatch.setattr(decoders, "SMALL_IMAGE", 0)

    together = threading.Barrier(4, timeout=10)  # met only if four decodes run at once
    opened = Image.open

    def open_meeting(*args, **kwargs):  # type: ignore[no-untyped-def]
        together.wait()
        return opened(*args, **kwargs)

    monkeypatch.setattr(Image, "open", open_meeting)
    arrays = numpy_batch(_images(8), ["image"], DataFormat.IMAGES, "/imgs", workers=4)["image"]
    assert arrays.shape == (8, 4, 3, 3) and arrays[:, 0, 0, 0].tolist() == list(range(8))  # in row order


def test_a_parallel_decode_names_the_file_that_does_not_decode() -> None:
    batch = _images(6)
    images = batch.column("image").to_pylist()
    images[4] = b"not a png"
    batch = batch.set_column(1, "image", pa.array(images, pa.binary()))
    with pytest.raises(DataError, match=r"/imgs/4\.png \(row 4\): the image does not decode"):
        numpy_batch(batch, ["image"], DataFormat.IMAGES, "/imgs", workers=3)


def _shares(array: np.ndarray, arrow: pa.Array) -> bool:
    buffer = arrow.buffers()[-1]
    start = array.__array_interface__["data"][0]
    return buffer.address <= start < buffer.address + buffer.size


@pytest.mark.parametrize("layout", ["numbers", "fixed-size lists", "lists of one length"])
def test_arrow_columns_reach_numpy_without_a_copy(layout: str) -> None:
    values = pa.array(np.arange(64, dtype=np.float32))
    column = {"numbers": values, "fixed-size lists": pa.FixedSizeListArray.from_arrays(values, 8),
              "lists of one length": pa.ListArray.from_arrays(pa.array(range(0, 65, 8), pa.int32()), values)}[layout]
    # As a table read whole gives it: a chunked column of one chunk (the results' `output`, a Parquet read).
    array = column_to_numpy(pa.chunked_array([column]), "x", list(range(len(column))), "w")
    assert array.shape == ((64,) if layout == "numbers" else (8, 8))
    assert array.ravel().tolist() == list(range(64))
    assert _shares(array, values), layout
    ragged = pa.array([[1.0], [2.0, 3.0]])  # lists of several lengths: still refused, naming the row
    with pytest.raises(DataError, match=r"row 11\): column 'x' holds \(2,\)"):
        column_to_numpy(ragged, "x", [10, 11], "w")


def _folder(tmp_path, count: int):  # type: ignore[no-untyped-def]
    from farm import data
    from farm.core.dataset import DatasetSpec

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(count):
        (folder / f"{i:03d}.png").write_bytes(_png(i))
    spec = DatasetSpec(location=str(folder), format="images")
    return folder, spec, data.plan(spec)


def test_a_shard_decodes_several_batches_at_once_and_hands_them_on_in_order(tmp_path,  # type: ignore[no-untyped-def]
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The inference kind's reader: batches of 2 on 4 threads meet only if two batches decode at once."""
    from pathlib import Path

    from PIL import Image

    from farm.core.tasks import DataTask, ShardTask
    from farm.data import decoders
    from farm_agent.work.kinds.inference import model_batches

    monkeypatch.setattr(decoders, "SMALL_IMAGE", 0)  # threads, so that the barrier sees them
    together = threading.Barrier(4, timeout=10)
    opened = Image.open

    def open_meeting(*args, **kwargs):  # type: ignore[no-untyped-def]
        together.wait()
        return opened(*args, **kwargs)

    monkeypatch.setattr(Image, "open", open_meeting)
    _, spec, plan = _folder(tmp_path, 8)
    task = ShardTask(job_id="j", index=0, start=0, stop=8, model="m:f", weights=None, dataset="", batch_size=2,
                     backend="cpu", device="cpu", threads=4, data=DataTask(spec=spec, plan=plan))
    batches = list(model_batches(task, Path.cwd()))
    assert [b.table.column(ROW_ID).to_pylist() for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [b.inputs[:, 0, 0, 0].tolist() for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_batches_decoding_at_once_are_bounded() -> None:
    from farm.data.batches import numpy_batches

    read = []

    def source():  # type: ignore[no-untyped-def]
        for start in range(0, 20, 2):
            read.append(start)
            yield _images(20).slice(start, 2)

    stream = numpy_batches(source(), ["image"], DataFormat.IMAGES, "/imgs", workers=2, ahead=3)
    batch, arrays = next(stream)
    assert batch.column(ROW_ID).to_pylist() == [0, 1] and arrays["image"][:, 0, 0, 0].tolist() == [0, 1]
    assert read == [0, 2, 4]  # three batches in flight, not the shard
    next(stream)
    assert read == [0, 2, 4, 6]
    stream.close()
    assert read == [0, 2, 4, 6]


def test_with_batches_decoding_ahead_a_bad_file_fails_its_batch_after_the_ones_before(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A file that does not decode and one that does not read: each named with its row range (the head skips that
    row alone: farm.scheduler.bad_rows), after the batches before it were handed on, as one batch at a time would."""
    from farm import data
    from farm.data.batches import numpy_batches

    folder, spec, plan = _folder(tmp_path, 10)
    (folder / "005.png").write_bytes(b"not a png")
    stream = numpy_batches(data.read(plan, 0, 10, None, 2), ["image"], plan.format, plan.location, workers=2,
                           ahead=4)
    assert [next(stream)[0].column(ROW_ID).to_pylist() for _ in range(2)] == [[0, 1], [2, 3]]
    with pytest.raises(DataError, match=r"005\.png \(row 5\): the image does not decode") as caught:
        next(stream)
    assert caught.value.rows == (5, 6)
    (folder / "005.png").write_bytes(_png(5))
    (folder / "003.png").unlink()  # gone since planning: it does not read
    stream = numpy_batches(data.read(plan, 0, 10, None, 2), ["image"], plan.format, plan.location, workers=2,
                           ahead=4)
    assert next(stream)[0].column(ROW_ID).to_pylist() == [0, 1]
    with pytest.raises(DataError, match=r"003\.png \(row 3\): does not read") as caught:
        next(stream)
    assert caught.value.rows == (3, 4)


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_local_folder_is_read_by_its_decoders_not_by_the_shards_reader(tmp_path, pool: str,  # type: ignore[no-untyped-def]
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the node sees the folder itself, a shard's reader hands its decoders the files' paths and opens none (a
    DataLoader's workers read their own files too); the decoders read them, in order, and name one that does not
    read or decode with its row. Passed through, `image` is read as bytes as before."""
    from pathlib import Path

    from farm import data
    from farm.core.tasks import DataTask, ShardTask
    from farm.data import decoders
    from farm.data.formats import images
    from farm_agent.work.kinds.inference import model_batches

    monkeypatch.setattr(decoders, "SMALL_IMAGE", 0 if pool == "threads" else 1 << 30)
    reads: list[int] = []
    contents = images._contents

    def counted(fs, paths):  # type: ignore[no-untyped-def]
        reads.append(len(paths))
        return contents(fs, paths)

    monkeypatch.setattr(images, "_contents", counted)
    folder, spec, plan = _folder(tmp_path, 8)

    def task(passthrough: tuple[str, ...] = ()) -> ShardTask:
        located = spec.model_copy(update={"passthrough": passthrough})
        return ShardTask(job_id="j", index=0, start=0, stop=8, model="m:f", weights=None, dataset="", batch_size=3,
                         backend="cpu", device="cpu", threads=2, data=DataTask(spec=located, plan=plan))

    batches = list(model_batches(task(), Path.cwd()))
    assert reads == []  # the reader opened no file
    assert [b.inputs[:, 0, 0, 0].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [b.table.column_names for b in batches] == [[ROW_ID]] * 3  # the paths never reach the results

    kept = list(model_batches(task(("image",)), Path.cwd()))
    assert reads == [8] and kept[0].table.column("image")[0].as_py() == _png(0)  # passed through: read as bytes
    assert [b.inputs[:, 0, 0, 0].tolist() for b in kept] == [[0, 1, 2], [3, 4, 5], [6, 7]]

    (folder / "004.png").write_bytes(b"not a png")
    (folder / "007.png").unlink()
    stream = model_batches(task(), Path.cwd())
    assert next(stream).table.column(ROW_ID).to_pylist() == [0, 1, 2]
    with pytest.raises(DataError, match=r"004\.png \(row 4\): the image does not decode") as caught:
        next(stream)
    assert caught.value.rows == (4, 5)
    stream = data.read(plan, 6, 8, [images.FILE, "path"], 2)
    from farm.data.batches import numpy_batches

    with pytest.raises(DataError, match=r"007\.png \(row 7\): does not read: No such file") as caught:
        list(numpy_batches(stream, ["image"], plan.format, plan.location, workers=2))
    assert caught.value.rows == (7, 8)


def test_a_folder_this_machine_does_not_hold_comes_as_bytes_whatever_the_reader_asks() -> None:
    import fsspec

    from farm.core.dataset import DataFile
    from farm.data.formats import images

    fs = fsspec.filesystem("memory")
    for i in range(3):
        fs.pipe(f"/bucket/imgs/{i}.png", _png(i))
    pieces = [(DataFile(path=f"{i}.png", offset=i, units=1), 0, 1) for i in range(3)]
    (batch,) = images.read(fs, "/bucket/imgs", "memory://bucket/imgs", pieces, [images.FILE, "path"], 8)
    assert images.FILE not in batch.schema.names and batch.column("image")[2].as_py() == _png(2)
