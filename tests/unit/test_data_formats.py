"""Every dataset format planned without reading its data and read back in ranges cut anywhere: each row exactly once,
in order, batches never over their size; and malformed inputs fail with one line naming the file and the row."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm import data
from farm.core.dataset import ROW_ID, DatasetPlan, DatasetSpec, Unit
from farm.core.errors import DataError, SpecError
from farm.data.batches import column_to_numpy, model_inputs, numpy_batch, rebatch

ROWS = 500


def read_all(plan: DatasetPlan, cuts: list[int], columns: list[str] | None = None, batch_rows: int = 37
             ) -> pa.Table:
    batches = []
    for start, stop in zip(cuts, cuts[1:]):
        for batch in data.read(plan, start, stop, columns, batch_rows):
            assert 0 < batch.num_rows <= batch_rows
            batches.append(pa.Table.from_batches([batch]))
    return pa.concat_tables(batches, promote_options="permissive")


def cuts_of(plan: DatasetPlan, seed: int = 0) -> list[int]:
    inner = np.random.default_rng(seed).integers(1, plan.size, 9).tolist()
    return sorted({0, plan.size, *inner})


def write_parquet_folder(folder: Path, files: int = 3) -> None:
    folder.mkdir()
    per = ROWS // files
    for i in range(files):
        start, stop = i * per, ROWS if i == files - 1 else (i + 1) * per
        x = np.arange(start, stop)
        pq.write_table(pa.table({"x": x, "v": pa.FixedSizeListArray.from_arrays(
            pa.array(np.repeat(x, 2).astype(np.float32)), 2), "name": [f"n{k}" for k in x]}),
            folder / f"part-{i}.parquet", row_group_size=40)
    (folder / "_SUCCESS").write_text("")  # skipped, as pyarrow's dataset layer skips it


def write_jsonl(path: Path, bad_row: int | None = None) -> None:
    with path.open("w") as f:
        for i in range(ROWS):
            f.write("{not json\n" if i == bad_row else json.dumps({"x": i, "name": f"n{i}"}) + "\n")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "text", "npy", "hf"])
def test_ranges_cut_anywhere_read_each_row_once_in_order(fmt: str, tmp_path: Path) -> None:
    if fmt == "parquet":
        write_parquet_folder(tmp_path / "d")
        spec = DatasetSpec(location=str(tmp_path / "d"), format="parquet", inputs=["v"], passthrough=["name"])
    elif fmt == "jsonl":
        write_jsonl(tmp_path / "d.jsonl")
        spec = DatasetSpec(location=str(tmp_path / "d.jsonl"), inputs=["x"])
    elif fmt == "csv":
        (tmp_path / "d.csv").write_text("x,name\n" + "".join(f"{i},n{i}\r\n" for i in range(ROWS)))
        spec = DatasetSpec(location=str(tmp_path / "d.csv"), inputs=["x"])
    elif fmt == "text":
        (tmp_path / "d.txt").write_text("".join(f"{i}\n" for i in range(ROWS - 1)) + f"{ROWS - 1}")  # no last \n
        spec = DatasetSpec(location=str(tmp_path / "d.txt"))
    elif fmt == "npy":
        np.save(tmp_path / "d.npy", np.arange(ROWS * 6, dtype=np.float32).reshape(ROWS, 2, 3))
        spec = DatasetSpec(location=str(tmp_path / "d.npy"))
    else:  # a real save_to_disk folder, written by the datasets package
        import datasets

        datasets.Dataset.from_dict({"x": list(range(ROWS)), "name": [f"n{i}" for i in range(ROWS)]}).save_to_disk(
            str(tmp_path / "hf"), max_shard_size=2_000)
        spec = DatasetSpec(location=str(tmp_path / "hf"), format="hf", inputs=["x"])
    plan = data.plan(spec)
    assert (plan.unit is Unit.BYTES) == (fmt in ("jsonl", "csv", "text"))
    if plan.unit is Unit.ROWS:
        assert plan.rows == plan.size == ROWS
    table = read_all(plan, cuts_of(plan))
    ids = table.column(ROW_ID).to_pylist()
    assert len(ids) == ROWS and ids == sorted(set(ids))
    first = {"parquet": "x", "jsonl": "x", "csv": "x", "text": "text", "npy": "data", "hf": "x"}[fmt]
    values = table.column(first).to_pylist()
    if fmt == "text":
        assert values == [str(i) for i in range(ROWS)]
    elif fmt == "npy":
        arrays = column_to_numpy(table.column("data"), "data", ids, plan.location)
        assert np.array_equal(arrays, np.arange(ROWS * 6, dtype=np.float32).reshape(ROWS, 2, 3))
    else:
        assert values == list(range(ROWS))
    if fmt == "hf":
        assert len(plan.files) > 1  # several Arrow files, rows counted in each


def test_parquet_reads_only_the_row_groups_of_its_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_parquet_folder(tmp_path / "d", files=1)
    plan = data.plan(DatasetSpec(location=str(tmp_path / "d"), format="parquet", inputs=["v"]))
    asked = []
    real = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        asked.append(kwargs["row_groups"])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    table = read_all(plan, [85, 130], ["v"])
    assert table.column(ROW_ID).to_pylist() == list(range(85, 130))
    assert asked == [[2], [3]]  # rows 80-119 and 120-159 of 40-row groups, one group at a time


def peak_bytes(read: Callable[[], Iterable[pa.RecordBatch]]) -> int:
    """The most Python memory (the bytes a file object returns included) held while the batches are read."""
    tracemalloc.start()
    try:
        for _ in read():
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_parquet_range_s_memory_does_not_grow_with_its_rows(tmp_path: Path) -> None:
    """A shard's reader holds about one row group, however many groups its range covers (pyarrow's reader over
    several groups kept each one's column chunks until it ended: 16 groups, 16 MiB held)."""
    group = 8192  # rows of 32 random float32: 1 MiB a row group, uncompressed
    values = np.random.default_rng(0).random((16 * group, 32), dtype=np.float32)
    pq.write_table(pa.table({"v": pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 32)}),
                   tmp_path / "d.parquet", row_group_size=group, compression="none")
    plan = data.plan(DatasetSpec(location=str(tmp_path / "d.parquet"), format="parquet", inputs=["v"]))
    two_groups = peak_bytes(lambda: data.read(plan, 0, 2 * group, ["v"], 1024))
    sixteen_groups = peak_bytes(lambda: data.read(plan, 0, 16 * group, ["v"], 1024))
    assert sixteen_groups < 1.5 * two_groups, (two_groups, sixteen_groups)


def test_parquet_row_groups_decode_in_parallel_in_order_each_row_once(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With workers, a file's row groups decode ahead on threads: the rows come as one thread reads them, cut
    anywhere; at most `workers` groups (and AHEAD_BYTES of them) are in flight."""
    import threading

    import farm.data.formats.parquet as parquet

    write_parquet_folder(tmp_path / "d")
    plan = data.plan(DatasetSpec(location=str(tmp_path / "d"), format="parquet", inputs=["v"]))
    one = read_all(plan, cuts_of(plan))
    threads: set[str] = set()
    in_flight, most = [0], [0]
    real = parquet._group_table

    def spy(*args):  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name)
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        try:
            return real(*args)
        finally:
            in_flight[0] -= 1

    monkeypatch.setattr(parquet, "_group_table", spy)
    batches = [b for start, stop in zip(cuts_of(plan), cuts_of(plan)[1:])
               for b in data.read(plan, start, stop, None, 37, workers=4)]
    assert all(0 < b.num_rows <= 37 for b in batches)
    assert pa.Table.from_batches(batches).equals(one)
    assert threads and all(name.startswith("farm-parquet") for name in threads) and most[0] <= 4


def test_a_row_group_two_ranges_cut_is_decoded_once_for_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """A shard cut inside a row group leaves the group's rest to the next shard: read one after the other (as one
    worker runs a job's shards), the group decodes once, and each range still gets exactly its own rows."""
    import farm.data.formats.parquet as parquet

    write_parquet_folder(tmp_path / "d", files=1)  # 40-row groups
    plan = data.plan(DatasetSpec(location=str(tmp_path / "d"), format="parquet", inputs=["v"]))
    decoded: list[int] = []
    real = parquet._group_table

    def spy(opened, metadata, index, columns):  # type: ignore[no-untyped-def]
        decoded.append(index)
        return real(opened, metadata, index, columns)

    monkeypatch.setattr(parquet, "_group_table", spy)
    cuts = [0, 50, 130, plan.size]  # inside groups 1 and 3
    parts = [pa.Table.from_batches(list(data.read(plan, start, stop, None, 37, workers=2)))
             for start, stop in zip(cuts, cuts[1:])]
    assert [part.column("row_id").to_pylist() for part in parts] == [list(range(a, b)) for a, b in zip(cuts, cuts[1:])]
    assert pa.concat_tables(parts).equals(read_all(plan, [0, plan.size]))
    assert sorted(decoded) == list(range(-(-plan.size // 40)))  # each group once: 1 and 3 not again
    again = list(data.read(plan, 50, 130, None, 37, workers=2))  # a cut is shared once: then read anew
    assert sum(b.num_rows for b in again) == 80 and decoded.count(1) == 2


def test_a_corrupt_row_group_read_in_parallel_is_named_with_its_rows(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import farm.data.formats.parquet as parquet

    write_parquet_folder(tmp_path / "d", files=1)
    plan = data.plan(DatasetSpec(location=str(tmp_path / "d"), format="parquet", inputs=["v"]))
    real = parquet._group_table

    def failing(opened, metadata, index, columns):  # type: ignore[no-untyped-def]
        if index == 2:
            raise OSError("Couldn't deserialize thrift\nDeserializing page header failed.")
        return real(opened, metadata, index, columns)

    monkeypatch.setattr(parquet, "_group_table", failing)
    before = [b for b in data.read(plan, 0, 80, ["v"], 16, workers=4)]
    assert sum(b.num_rows for b in before) == 80  # the groups before it read
    with pytest.raises(DataError, match=r"rows 80-119 \(row group 2\) do not read: Couldn't deserialize") as caught:
        list(data.read(plan, 0, 160, ["v"], 16, workers=4))
    assert caught.value.rows == (80, 120)


def test_a_batch_as_model_inputs(tmp_path: Path) -> None:
    write_parquet_folder(tmp_path / "d")
    plan = data.plan(DatasetSpec(location=str(tmp_path / "d"), format="parquet", inputs=["v"]))
    batch = next(rebatch(data.read(plan, 0, ROWS, ["v"], 7), 64))
    assert batch.num_rows == 64
    arrays = numpy_batch(batch, ["v"], plan.format, plan.location)
    inputs = model_inputs(arrays, ("v",), plan.location, None)
    assert inputs.shape == (64, 2) and inputs.dtype == np.float32
    doubled = model_inputs(arrays, ("v",), plan.location, lambda b: b["v"] * 2, "m:double")
    assert np.array_equal(doubled, inputs * 2)


def test_images_decode_on_the_reader_in_sorted_order(tmp_path: Path) -> None:
    from PIL import Image

    folder = tmp_path / "imgs"
    (folder / "b").mkdir(parents=True)
    rng = np.random.default_rng(0)
    pixels = {}
    for i in range(12):
        name = f"b/{i:02d}.png" if i % 2 else f"{i:02d}.png"
        pixels[name] = rng.integers(0, 255, (8, 8), dtype=np.uint8)
        Image.fromarray(pixels[name]).save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    plan = data.plan(DatasetSpec(location=str(folder), format="images"))
    assert plan.rows == 12 and [f.path for f in plan.files] == sorted(pixels)
    batches = list(rebatch(data.read(plan, 3, 11, None, 4), 5))
    assert [b.num_rows for b in batches] == [5, 3]
    decoded = numpy_batch(batches[0], ["image"], plan.format, plan.location)["image"]
    assert decoded.shape == (5, 8, 8)
    assert np.array_equal(decoded[0], pixels[sorted(pixels)[3]])


# ---- malformed inputs: one line naming the file and the row


def test_a_bad_json_line_names_its_file_and_row(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", bad_row=300)
    plan = data.plan(DatasetSpec(location=str(tmp_path / "d.jsonl"), inputs=["x"]))
    offset = len("".join(json.dumps({"x": i, "name": f"n{i}"}) + "\n" for i in range(300)).encode())
    assert len(read_all(plan, [0, offset - 5])) == 300  # the rows before it, in a range without it, read
    with pytest.raises(DataError, match=rf"d\.jsonl: row at byte {offset}: not JSON") as caught:
        read_all(plan, [offset - 5, plan.size])
    assert "\n" not in str(caught.value)


def test_a_csv_row_with_missing_fields_names_its_row(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("x,y\n1,2\n3\n5,6\n")
    plan = data.plan(DatasetSpec(location=str(tmp_path / "d.csv"), inputs=["x"]))
    with pytest.raises(DataError, match=r"d\.csv: row at byte 8: 1 fields, the header has 2"):
        read_all(plan, [0, plan.size])


def test_a_truncated_parquet_file_fails_the_ranges_over_it_only(tmp_path: Path) -> None:
    write_parquet_folder(tmp_path / "d")
    plan = data.plan(DatasetSpec(location=str(tmp_path / "d"), format="parquet", inputs=["v"]))
    victim = tmp_path / "d" / "part-1.parquet"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # cut after planning, as a copy in progress
    assert len(read_all(plan, [0, plan.files[1].offset])) == plan.files[0].units
    with pytest.raises(DataError, match=r"d/part-1\.parquet: rows 0-\d+ do not read"):
        read_all(plan, [plan.files[1].offset, plan.files[2].offset])
    with pytest.raises(DataError, match=r"part-1\.parquet: not a whole Parquet file"):  # and at planning
        data.plan(DatasetSpec(location=str(tmp_path / "d"), format="parquet", inputs=["v"]))


def test_an_image_that_does_not_decode_names_its_file_and_row(tmp_path: Path) -> None:
    from PIL import Image

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(4):
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(folder / f"{i}.png")
    (folder / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    plan = data.plan(DatasetSpec(location=str(folder), format="images"))
    good = next(data.read(plan, 0, 2, None, 8))
    assert numpy_batch(good, ["image"], plan.format, plan.location)["image"].shape == (2, 4, 4)
    bad = next(data.read(plan, 0, 4, None, 8))
    with pytest.raises(DataError, match=r"imgs/2\.png \(row 2\): the image does not decode"):
        numpy_batch(bad, ["image"], plan.format, plan.location)


def test_a_local_image_gone_since_planning_names_its_file_and_row(tmp_path: Path) -> None:
    from PIL import Image

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(4):
        Image.fromarray(np.full((4, 4), i, np.uint8)).save(folder / f"{i}.png")
    plan = data.plan(DatasetSpec(location=str(folder), format="images"))
    (folder / "2.png").unlink()
    batches = data.read(plan, 0, 4, None, 2)
    assert next(batches).column("image").to_pylist() == [(folder / f"{i}.png").read_bytes() for i in (0, 1)]
    with pytest.raises(DataError, match=r"imgs/2\.png \(row 2\): does not read: .*No such file"):
        next(batches)


def test_a_truncated_npy_file_names_the_missing_row(tmp_path: Path) -> None:
    np.save(tmp_path / "d.npy", np.zeros((100, 4), np.float32))
    plan = data.plan(DatasetSpec(location=str(tmp_path / "d.npy")))
    path = tmp_path / "d.npy"
    path.write_bytes(path.read_bytes()[:-16 * 30])
    from fsspec.implementations.memory import MemoryFileSystem

    memory = MemoryFileSystem()
    memory.pipe_file("/d.npy", path.read_bytes())
    with pytest.raises(DataError, match=r"d\.npy: truncated: row 70 is missing"):  # as a remote node reads it
        list(data.read(plan, 0, 100, None, 50, fs=memory, root="/d.npy"))


@pytest.mark.parametrize(("spec", "message"), [
    ({"location": "x.bin"}, "say the format of 'x.bin'"),
    ({"location": "ftp://h/x.csv"}, "ftp:// is not a location"),
    ({"location": "https://h/imgs", "format": "images"}, r"an http\(s\) location is one file"),
    ({"location": "x.txt", "inputs": ["y"]}, "format 'text' has the columns text"),
    ({"location": "x.parquet", "preprocess": "nocolon"}, "not of the form"),
])
def test_bad_dataset_specs_are_refused(spec: dict[str, object], message: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        DatasetSpec.model_validate(spec)


def test_planning_checks_the_named_columns(tmp_path: Path) -> None:
    write_parquet_folder(tmp_path / "d")
    with pytest.raises(SpecError, match=r"no column 'nope' in the dataset \(it has x, v, name\)"):
        data.plan(DatasetSpec(location=str(tmp_path / "d"), format="parquet", inputs=["nope"]))
    with pytest.raises(SpecError, match="name the ones the model reads"):
        data.plan(DatasetSpec(location=str(tmp_path / "d"), format="parquet"))
    with pytest.raises(SpecError, match="not found"):
        data.plan(DatasetSpec(location=str(tmp_path / "missing"), format="parquet"))
