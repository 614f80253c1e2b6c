"""The stdlib docstring corpus, tokenized with all-MiniLM-L6-v2's own tokenizer, as Farm's dataset.

Each item is int64 [2, L]: row 0 the token ids ([CLS] ... [SEP], then [PAD]), row 1 the attention mask. Every
passage is padded to the same L (the model's max_seq_length, 256) so that one array holds the corpus and shards
cut from it line up; the model trims the padding again per batch. Tokenizing the ~3,750 passages takes under
a second, so nothing is cached.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from examples.embeddings import corpus, max_seq_length, model_dir


def tokenize(texts: Sequence[str], length: int | None = None) -> np.ndarray:
    """int64 [len(texts), 2, length] ids and masks, truncated and padded to `length` (default max_seq_length)."""
    from tokenizers import Tokenizer

    length = max_seq_length() if length is None else length
    # tokenizer.json carries the hub's 128-token truncation and padding; sentence-transformers uses 256 instead.
    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=length)
    tokenizer.enable_padding(length=length)
    encodings = tokenizer.encode_batch(list(texts))
    ids = np.array([encoding.ids for encoding in encodings], dtype=np.int64).reshape(len(encodings), length)
    mask = np.array([encoding.attention_mask for encoding in encodings], dtype=np.int64).reshape(ids.shape)
    return np.ascontiguousarray(np.stack([ids, mask], axis=1))


def passages() -> np.ndarray:
    """The whole corpus tokenized: int64 [N, 2, 256], N about 3,750 (it depends on the Python version)."""
    return tokenize(corpus.texts())
