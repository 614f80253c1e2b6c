"""Core ML conversion, for real: the digits CNN and the embeddings example's MiniLM become .mlpackages whose specs,
read back, say fp16 compute precision, compute units CPU_AND_NE, float32 (int32 for token ids) inputs and float32
outputs, and static shapes per batch bucket. Each model is converted once per test session (module fixtures): the
MiniLM conversion takes about a minute on two cores."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from farm_agent.coreml.ane_bert import MeanPooledEmbedderANE
from farm_agent.coreml.buckets import DEFAULT_BUCKETS
from farm_agent.coreml.convert import (
    COMPUTE_UNITS,
    Conversion,
    ConversionError,
    cached_conversion,
    convert,
    model_hash,
)
from farm_agent.coreml.package_info import read_package
from farm_agent.work.jobcode import build_model

from tests.conftest import FIXTURES, ROOT

pytest.importorskip("coremltools", reason="coremltools is in the dev and apple extras")


def digits_model() -> torch.nn.Module:
    return build_model("examples.digits.model:build", "examples/digits/weights.pt", ROOT)


def digits_inputs() -> np.ndarray:
    from examples.digits.data import test_set

    return test_set()[0]


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Conversion]:
    out = tmp_path_factory.mktemp("coreml") / "digits.mlpackage"
    yield convert(digits_model(), digits_inputs()[:8], out)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Conversion, float]]:
    from examples.embeddings.data import tokenize
    from examples.embeddings.model import build

    module = build()
    tokens = tokenize(["Return the sum of the values.", "A subclass of dict that remembers insertion order."])
    out = tmp_path_factory.mktemp("coreml") / "minilm.mlpackage"
    began = time.perf_counter()
    # One bucket: every bucket is the same conversion again, and the buckets are exercised on the digits model.
    conversion = convert(module, tokens, out, buckets=(8,))
    yield conversion, time.perf_counter() - began


# --- digits: a small CNN, four buckets ---


def test_digits_package_has_one_static_function_per_bucket_with_fp32_io(digits: Conversion) -> None:
    package = read_package(digits.package.path)  # read back from disk, not from the conversion's memory
    assert package.buckets == DEFAULT_BUCKETS
    assert package.default_function == "batch_64"
    for f in package.functions:
        assert [(t.name, t.shape, t.dtype) for t in f.inputs] == [("input", (f.bucket, 1, 8, 8), "float32")]
        assert [(t.name, t.shape, t.dtype) for t in f.outputs] == [("output", (f.bucket, 10), "float32")]


def test_digits_package_computes_in_fp16_for_cpu_and_ne(digits: Conversion) -> None:
    package = read_package(digits.package.path)
    assert package.precision == "float16"
    assert package.compute_units == COMPUTE_UNITS == "CPU_AND_NE"
    assert package.spec_version >= 9  # macOS 15: multifunction packages
    assert package.metadata["farm.batch_buckets"] == "1,8,32,64"
    assert package.metadata["farm.source"] == digits.source == "torch.export"
    # the fp32 input is cast to fp16 once, the output back to fp32 once
    ops = package.function(64).op_counts
    assert (ops["conv"], ops["linear"], ops["relu"], ops["max_pool"], ops["cast"]) == (2, 2, 3, 1, 2)


def test_digits_notes_say_why_its_tensors_suit_the_ane_poorly(digits: Conversion) -> None:
    # 8x8 images: the last axis is 8 (then 4 after pooling), padded to 32 fp16 values on the ANE.
    (padding,) = [n for n in digits.notes if "last axis" in n]
    assert "narrowest 4" in padding and "8x" in padding
    assert not any("integer inputs" in n for n in digits.notes)


def test_the_package_is_cached_by_model_hash_and_a_new_weight_is_a_new_model(tmp_path: Path) -> None:
    module, examples = digits_model(), digits_inputs()[:4]
    first = cached_conversion(module, examples, buckets=(8,), state_dir=tmp_path)
    assert not first.cached and first.package.path.parent == tmp_path / "coreml"
    again = cached_conversion(module, examples, buckets=(8,), state_dir=tmp_path)
    assert again.cached and again.package.path == first.package.path and again.seconds == 0.0
    assert again.notes == first.notes and again.source == first.source
    assert again.package.metadata["farm.model_hash"] == first.package.path.stem
    key = model_hash(module, examples.shape[1:], examples.dtype, (8,))
    with torch.no_grad():
        module[0].bias[0] += 1.0
    assert model_hash(module, examples.shape[1:], examples.dtype, (8,)) != key
    assert model_hash(digits_model(), examples.shape[1:], examples.dtype, (1, 8)) != key


def test_a_model_core_ml_cannot_convert_says_why_for_each_capture(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(FIXTURES / "apple"))
    try:
        from anejob import inverse, matrices
    finally:
        sys.path.remove(str(FIXTURES / "apple"))
    with pytest.raises(ConversionError) as raised:
        convert(inverse(), matrices(), tmp_path / "inverse.mlpackage", buckets=(1,))
    message = str(raised.value)
    assert "linalg_inv" in message and "torch.export" in message and "torch.jit.trace" in message
    assert "\n" not in message
    assert not (tmp_path / "inverse.mlpackage").exists()


def test_bad_buckets_and_no_examples_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="positive"):
        convert(digits_model(), digits_inputs()[:2], tmp_path / "x.mlpackage", buckets=(0,))
    with pytest.raises(ValueError, match="no example items"):
        convert(digits_model(), digits_inputs()[:0], tmp_path / "x.mlpackage")


# --- MiniLM: a transformer, rewritten for the ANE ---


def test_the_ane_rewrite_of_minilm_gives_the_same_embeddings_as_the_original() -> None:
    from examples.embeddings.data import tokenize
    from examples.embeddings.model import build

    original = build()
    rewritten = MeanPooledEmbedderANE(original.encoder).eval()
    texts = ["Return a new set.", "Open a file and return a stream; raise OSError upon failure.", "x"]
    tokens = torch.from_numpy(tokenize(texts, length=32))
    with torch.inference_mode():
        np.testing.assert_allclose(rewritten(tokens).numpy(), original(tokens).numpy(), atol=1e-5, rtol=1e-4)


def test_minilm_converts_with_int32_tokens_in_and_fp32_vectors_out(minilm: tuple[Conversion, float]) -> None:
    conversion, seconds = minilm
    package = read_package(conversion.package.path)
    (function,) = package.functions
    assert function.name == "batch_8"
    assert [(t.name, t.shape, t.dtype) for t in function.inputs] == [("input", (8, 2, 256), "int32")]
    assert [(t.name, t.shape, t.dtype) for t in function.outputs] == [("output", (8, 384), "float32")]
    assert package.precision == "float16" and package.compute_units == "CPU_AND_NE"
    print(f"MiniLM conversion: {seconds:.1f} s, captured with {conversion.source}")


def test_minilm_is_converted_in_apples_ane_layout(minilm: tuple[Conversion, float]) -> None:
    conversion, _ = minilm
    ops = conversion.package.function(8).op_counts
    # 6 layers: q, k, v, out, intermediate, output as 1x1 convs; attention per head (12): two einsums, one softmax.
    assert ops["conv"] == 6 * 6
    assert ops["einsum"] == 6 * 12 * 2 and ops["softmax"] == 6 * 12
    assert "linear" not in ops and "matmul" not in ops
    assert ops.get("transpose", 0) <= 2 * 6 + 1  # the key's per layer, and the embedding's once
    assert any("rewritten per Apple's" in n for n in conversion.notes)
    # the rewrites travel with the package, so a cached package tells them too
    rewrites = json.loads(conversion.package.metadata["farm.rewrites"])
    assert len(rewrites) == 2 and rewrites == [n for n in conversion.notes if n.startswith("rewritten")]
    assert any(n.startswith("integer inputs (input)") for n in conversion.notes)
    assert not any("rank-3" in n for n in conversion.notes)
