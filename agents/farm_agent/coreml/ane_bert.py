"""A BERT encoder rewritten for the Neural Engine, following Apple's "Deploying Transformers on the Apple Neural
Engine" (2022) and its reference code (apple/ml-ane-transformers), with the weights of a transformers BertModel.

What changes, and why (the article's principles):
1. Data format (B, C, 1, S) instead of (B, S, C): the ANE's native 4-D channels-first layout, and the last axis,
   which the ANE pads to 64 bytes, is the long sequence axis (S) rather than a short one. Every nn.Linear becomes
   a 1x1 nn.Conv2d on that layout (same weights, reshaped).
2. Chunking large intermediate tensors: attention is computed per head (a list of (B, S, 1, S) score tensors,
   softmax over the key axis 1), not as one (B, heads, S, S) tensor, so each chunk stays in the ANE's L2 cache.
3. Minimising memory copies: no reshape/transpose between the heads (split on the channel axis and einsum); the
   only transposes left are the one after the embedding lookup and the key's per-layer one.
4. LayerNorm over the channel axis of the 4-D layout, written out (mean, variance, rsqrt) as in Apple's LayerNormANE.
The attention mask is additive with -1e4, not the fp32 minimum: the model runs in fp16 (whose min is -65504).

The embedding lookup (a gather by integer token id) stays as it is: it is integer work, which the ANE does not do.
Results match the transformers BertModel to fp32 rounding on the CPU (tests/unit/test_coreml_convert.py checks).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# Added to the scores of padding keys: far below any real score, and representable in fp16.
MASK_VALUE = -1e4


def conv_from_linear(linear: nn.Linear) -> nn.Conv2d:
    """A 1x1 convolution on (B, C, 1, S) computing what `linear` computes on (B, S, C)."""
    conv = nn.Conv2d(linear.in_features, linear.out_features, kernel_size=1, bias=linear.bias is not None)
    with torch.no_grad():
        conv.weight.copy_(linear.weight[:, :, None, None])
        if linear.bias is not None:
            conv.bias.copy_(linear.bias)
    return conv


class LayerNormANE(nn.Module):
    """LayerNorm over the channel axis (1) of a (B, C, 1, S) tensor."""

    def __init__(self, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.eps = norm.eps
        self.weight = nn.Parameter(norm.weight.detach().clone().view(1, -1, 1, 1))
        self.bias = nn.Parameter(norm.bias.detach().clone().view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(dim=1, keepdim=True)
        variance = (centred * centred).mean(dim=1, keepdim=True)
        return centred * torch.rsqrt(variance + self.eps) * self.weight + self.bias


class SelfAttentionANE(nn.Module):
    def __init__(self, layer: nn.Module, heads: int) -> None:
        super().__init__()
        attention = layer.attention
        self.query = conv_from_linear(attention.self.query)
        self.key = conv_from_linear(attention.self.key)
        self.value = conv_from_linear(attention.self.value)
        self.out = conv_from_linear(attention.output.dense)
        self.norm = LayerNormANE(attention.output.LayerNorm)
        self.head_dim = self.query.out_channels // heads
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """x: (B, C, 1, S); key_mask: (B, S, 1, 1), 0 for real keys and MASK_VALUE for padding."""
        queries = self.query(x).split(self.head_dim, dim=1)  # each (B, d, 1, S)
        keys = self.key(x).transpose(1, 3).split(self.head_dim, dim=3)  # each (B, S, 1, d)
        values = self.value(x).split(self.head_dim, dim=1)  # each (B, d, 1, S)
        heads = []
        for q, k, v in zip(queries, keys, values, strict=True):
            scores = torch.einsum("bchq,bkhc->bkhq", q, k) * self.scale + key_mask  # (B, S_keys, 1, S_queries)
            weights = scores.softmax(dim=1)
            heads.append(torch.einsum("bkhq,bchk->bchq", weights, v))  # (B, d, 1, S)
        return self.norm(x + self.out(torch.cat(heads, dim=1)))


class BertLayerANE(nn.Module):
    def __init__(self, layer: nn.Module, heads: int) -> None:
        super().__init__()
        self.attention = SelfAttentionANE(layer, heads)
        self.intermediate = conv_from_linear(layer.intermediate.dense)
        self.output = conv_from_linear(layer.output.dense)
        self.norm = LayerNormANE(layer.output.LayerNorm)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        attended = self.attention(x, key_mask)
        return self.norm(attended + self.output(F.gelu(self.intermediate(attended))))


class BertEncoderANE(nn.Module):
    """(ids, mask) int (B, S) -> hidden states (B, C, 1, S), from a transformers BertModel (absolute positions,
    exact GELU, token type 0 throughout: what a sentence encoder is given)."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        config = bert.config
        if config.hidden_act != "gelu":
            raise ValueError(f"BERT with activation {config.hidden_act!r}: only exact GELU is rewritten")
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"BERT with {config.position_embedding_type} positions: only absolute are rewritten")
        embeddings = bert.embeddings
        self.word = nn.Parameter(embeddings.word_embeddings.weight.detach().clone())
        # Position and token type 0 summed once: (1, C, 1, max_positions), sliced to S in forward.
        fixed = embeddings.position_embeddings.weight.detach() + embeddings.token_type_embeddings.weight.detach()[0]
        self.positions = nn.Parameter(fixed.t().contiguous()[None, :, None, :].clone())
        self.norm = LayerNormANE(embeddings.LayerNorm)
        self.layers = nn.ModuleList(BertLayerANE(layer, config.num_attention_heads) for layer in bert.encoder.layer)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = F.embedding(ids, self.word).transpose(1, 2).unsqueeze(2)  # (B, S, C) -> (B, C, 1, S)
        x = self.norm(x + self.positions[..., :length])
        key_mask = ((1 - mask.to(x.dtype)) * MASK_VALUE)[:, :, None, None]  # (B, S, 1, 1)
        for layer in self.layers:
            x = layer(x, key_mask)
        return x


class MeanPooledEmbedderANE(nn.Module):
    """int [B, 2, S] (token ids, attention mask) -> float [B, C]: mean over the real tokens, L2-normalised (the
    sentence-transformers pipeline Transformer -> Pooling(mean) -> Normalize), on the ANE layout."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.encoder = BertEncoderANE(bert)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids, mask = tokens[:, 0], tokens[:, 1]
        hidden = self.encoder(ids, mask)  # (B, C, 1, S)
        weights = mask.to(hidden.dtype)[:, None, None, :]  # (B, 1, 1, S)
        mean = (hidden * weights).sum(dim=3) / weights.sum(dim=3).clamp(min=1e-9)  # (B, C, 1)
        return F.normalize(mean.squeeze(2), p=2, dim=1)
