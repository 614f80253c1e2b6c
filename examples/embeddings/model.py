"""all-MiniLM-L6-v2 as one module: int64 [N, 2, L] (token ids, attention mask) -> float32 [N, 384] unit vectors."""

from __future__ import annotations

import json
import os

import torch
from torch import nn
from torch.nn import functional as F

from examples.embeddings import model_dir


# On the CPU a batch is embedded in groups of this many passages of similar length, each trimmed to its longest:
# the corpus mixes 10- to 256-token passages, and padding a whole batch of 32 to its longest takes over twice as long.
CPU_GROUP = 8


class MiniLMEmbedder(nn.Module):
    """A BERT encoder, mean-pooled over the real tokens and L2-normalised, as sentence-transformers does for MiniLM."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """`tokens[:, 0]` are token ids, `tokens[:, 1]` the attention mask (1 for real tokens, 0 for padding)."""
        # Accelerators gain little from the grouping and pay a host sync per group: one group there.
        group = CPU_GROUP if tokens.device.type == "cpu" else max(len(tokens), 1)
        order = torch.argsort(tokens[:, 1].sum(dim=1), descending=True, stable=True)
        out = torch.empty(len(tokens), self.encoder.config.hidden_size, dtype=torch.float32, device=tokens.device)
        for rows in order.split(group):
            out[rows] = self._embed(tokens[rows])
        return out

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        ids, mask = tokens[:, 0], tokens[:, 1]
        # Columns that are padding in every row change nothing but cost attention time.
        columns = mask.any(dim=0).nonzero()
        width = int(columns.max()) + 1 if len(columns) else 1
        ids, mask = ids[:, :width], mask[:, :width]
        hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return F.normalize(mean, p=2, dim=1)


def _check_pipeline() -> None:
    # MiniLMEmbedder hard-codes the pooling; refuse a package whose sentence-transformers pipeline says otherwise.
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((model_dir() / "modules.json").read_text())]
    pooling = json.loads((model_dir() / "1_Pooling" / "config.json").read_text())
    modes = {key for key, value in pooling.items() if key.startswith("pooling_mode") and value}
    if modules != ["Transformer", "Pooling", "Normalize"] or modes != {"pooling_mode_mean_tokens"}:
        raise RuntimeError(f"unexpected sentence-transformers pipeline {modules} with pooling {sorted(modes)}")


def build() -> nn.Module:
    """Load the bundled all-MiniLM-L6-v2 weights into a transformers BertModel and wrap it for Farm (eval mode)."""
    # Everything is on disk; make sure no hub lookup is ever attempted (a node may have no internet).
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from transformers import BertModel

    _check_pipeline()
    # The pooler (a dense layer on [CLS]) is unused but kept: dropping it makes transformers print a load report.
    encoder = BertModel.from_pretrained(model_dir(), local_files_only=True, dtype=torch.float32)
    return MiniLMEmbedder(encoder).eval()
