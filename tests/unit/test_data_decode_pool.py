"""Decoding on the pool that suits the decoder (farm.data.decoders): processes where it holds the GIL for much of an
item (Pillow on small images), threads where it does not; and a batch staged in pinned memory for a CUDA device
(farm_agent.work.staging), whose pinned branch only a CUDA machine runs: here, that it falls back cleanly."""

from __future__ import annotations

import io
import os
import signal

import numpy as np
import pyarrow as pa
import pytest

from farm.core.dataset import ROW_ID, DataFormat
from farm.core.errors import DataError
from farm.data import decoders
from farm.data.batches import numpy_batch
from farm.data.decoders import PILLOW, PoolKind, decode_all


def _png(side: int, value: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    noise = np.random.default_rng(value).integers(0, 255, (side, side, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buffer, format="PNG")
    return buffer.getvalue()


def test_pillow_decodes_small_images_on_processes_and_large_ones_on_threads() -> None:
    assert PILLOW.pool(len(_png(64, 0))) is PoolKind.PROCESSES
    assert PILLOW.pool(len(_png(256, 0))) is PoolKind.THREADS


def test_small_images_decode_in_decoder_processes_in_row_order() -> None:
    items = [_png(16, i) for i in range(9)]
    found = decode_all(PILLOW, items, workers=2)
    expected = [PILLOW.decode(item) for item in items]
    assert all(np.array_equal(a, b) for a, b in zip(found, expected, strict=True))
    pool = decoders._processes(2)
    pids = set(pool._processes)  # type: ignore[attr-defined]
    assert pids and os.getpid() not in pids


def test_a_batch_of_one_shape_comes_back_as_one_array_and_mixed_sizes_item_by_item() -> None:
    """Stacked where it was decoded (a decoder process sends one buffer back, not an array an item)."""
    items = [_png(16, i) for i in range(9)]
    for workers in (1, 2):
        found = decode_all(PILLOW, items, workers=workers)
        assert isinstance(found, np.ndarray) and found.shape == (9, 16, 16, 3)
        assert np.array_equal(found, np.stack([PILLOW.decode(item) for item in items]))
    mixed = decode_all(PILLOW, [*items[:4], _png(8, 9), *items[4:]], workers=2)
    assert isinstance(mixed, list) and [a.shape for a in mixed] == [(16, 16, 3)] * 4 + [(8, 8, 3)] + [  # type: ignore[union-attr]
        (16, 16, 3)] * 5


def test_a_bad_image_decoded_in_a_process_is_named_with_its_row() -> None:
    images = [_png(16, i) for i in range(6)]
    images[4] = b"\x89PNG\r\n\x1a\n truncated"
    batch = pa.record_batch({ROW_ID: pa.array(range(100, 106), pa.int64()), "image": pa.array(images, pa.binary()),
                             "path": pa.array([f"{i}.png" for i in range(6)])})
    with pytest.raises(DataError, match=r"^/imgs/4\.png \(row 104\): the image does not decode: \S"):
        numpy_batch(batch, ["image"], DataFormat.IMAGES, "/imgs", workers=2)


def test_a_decoder_process_that_dies_fails_its_batch_and_the_next_batch_decodes() -> None:
    items = [_png(16, i) for i in range(4)]
    decode_all(PILLOW, items, workers=2)
    for pid in list(decoders._processes(2)._processes):  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGKILL)  # as a file that crashes the codec would
    with pytest.raises(DataError, match="pillow decoder process died on a batch of 4 items"):
        decode_all(PILLOW, items, workers=2)
    assert len(decode_all(PILLOW, items, workers=2)) == 4


def test_large_images_decode_on_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decoders, "_processes", lambda workers: pytest.fail("a process pool for large images"))
    items = [_png(256, i) for i in range(3)]
    assert [a.shape for a in decode_all(PILLOW, items, workers=2)] == [(256, 256, 3)] * 3  # type: ignore[union-attr]


def test_a_batch_for_a_host_device_is_not_copied() -> None:
    from farm_agent.work.staging import staged

    inputs = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert staged(inputs, "cpu") is inputs and staged(inputs, "mps") is inputs


def test_a_batch_for_cuda_where_pinning_is_refused_goes_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without CUDA here, torch refuses pinned memory: the pageable batch still goes (the backend copies it)."""
    from farm_agent.work import staging

    inputs = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert staging.staged(inputs, "cuda:0") is inputs  # no CUDA on this machine
    monkeypatch.setattr(staging, "_cuda", lambda: True)
    import torch

    if not torch.cuda.is_available():
        assert staging.staged(inputs, "cuda:0") is inputs  # pinning refused: as it is
    assert staging.staged(np.array(["a"], dtype=object), "cuda:0").dtype == object


def _imported(name: str) -> bool:  # in a decoder process, before it decodes anything
    import sys

    return name in sys.modules


def test_a_new_decoder_process_has_pillow_and_its_plugins_already_imported() -> None:
    """Imported once in the decoders' server, not by each new process on its first image (a job's first batch)."""
    decoders._processes.cache_clear()  # a fresh pool: its processes forked from the server now
    pool = decoders._processes(3)
    try:
        assert all(pool.submit(_imported, name).result() for name in ("PIL.Image", "PIL.PngImagePlugin",
                                                                     "PIL.JpegImagePlugin"))
    finally:
        decoders._processes.cache_clear()
        pool.shutdown()
