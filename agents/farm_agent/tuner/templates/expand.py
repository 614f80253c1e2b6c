"""PyTorch's own composite modules written out as the ops they run, so that fx traces into them.

fx treats every module of torch.nn as a leaf: a model built from nn.TransformerEncoder is one opaque call to the
matcher, and its GEMMs, attention and norms are never offered to a template (a small ViT had 3 regions, the patch
embedding, the last norm and the head). Each expander here returns a module that shares the original's parameters
and computes the same function in eval mode, or None for a form it does not cover (the original then stays, a leaf).
A call with a mask runs the original module: masks are left to PyTorch.

One seam: EXPANDERS maps a module type to its expander; `expand` replaces every covered module of a model in place.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """nn.MultiheadAttention(x, x, x, need_weights=False) without masks: one input projection, attention on the
    heads, the output projection. Batch first or not, as the original."""

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        self.in_proj_weight, self.in_proj_bias = mha.in_proj_weight, mha.in_proj_bias
        self.out_proj = mha.out_proj
        self.heads, self.batch_first = mha.num_heads, mha.batch_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.batch_first:
            x = x.transpose(0, 1)
        batch, length, width = x.shape
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)
        qkv = qkv.reshape(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        out = self.out_proj(attended.transpose(1, 2).reshape(batch, length, width))
        return out if self.batch_first else out.transpose(0, 1)


def self_attention(mha: nn.MultiheadAttention) -> SelfAttention | None:
    """The covered form: one projection for q, k and v (same embedding dims), no bias_k/bias_v or zero attention."""
    if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn or mha.in_proj_weight is None:
        return None
    return SelfAttention(mha)


class MultiheadAttention(nn.Module):
    """nn.MultiheadAttention called as self-attention, mha(x, x, x, need_weights=False), without masks: written
    out; any other call (cross-attention, masks, the attention weights asked for) runs the original."""

    def __init__(self, mha: nn.MultiheadAttention, attention: SelfAttention) -> None:
        super().__init__()
        self.original, self.attention = mha, attention

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if query is key and key is value and key_padding_mask is None and not need_weights and attn_mask is None \
                and not is_causal:
            return self.attention(query), None
        return self.original(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                             attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal)


def multihead_attention(mha: nn.MultiheadAttention) -> MultiheadAttention | None:
    attention = self_attention(mha)
    return MultiheadAttention(mha, attention) if attention is not None else None


class EncoderLayer(nn.Module):
    """nn.TransformerEncoderLayer in eval mode (its dropouts are the identity), pre- or post-norm."""

    def __init__(self, layer: nn.TransformerEncoderLayer, attention: SelfAttention) -> None:
        super().__init__()
        self.original = layer
        self.attention = attention
        self.linear1, self.linear2 = layer.linear1, layer.linear2
        self.norm1, self.norm2 = layer.norm1, layer.norm2
        self.activation = layer.activation
        self.norm_first = layer.norm_first

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor | None = None,
                src_key_padding_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if src_mask is not None or src_key_padding_mask is not None or is_causal:
            return self.original(src, src_mask, src_key_padding_mask, is_causal)
        x = src
        if self.norm_first:
            x = x + self.attention(self.norm1(x))
            return x + self.linear2(self.activation(self.linear1(self.norm2(x))))
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.linear2(self.activation(self.linear1(x))))


def encoder_layer(layer: nn.TransformerEncoderLayer) -> EncoderLayer | None:
    attention = self_attention(layer.self_attn)
    return EncoderLayer(layer, attention) if attention is not None else None


class Encoder(nn.Module):
    """nn.TransformerEncoder: its layers in turn, then its norm if it has one."""

    def __init__(self, encoder: nn.TransformerEncoder, layers: list[nn.Module]) -> None:
        super().__init__()
        self.original = encoder
        self.layers = nn.ModuleList(layers)
        self.norm = encoder.norm

    def forward(self, src: torch.Tensor, mask: torch.Tensor | None = None,
                src_key_padding_mask: torch.Tensor | None = None, is_causal: bool | None = None) -> torch.Tensor:
        if mask is not None or src_key_padding_mask is not None or is_causal:
            return self.original(src, mask, src_key_padding_mask, is_causal)
        for layer in self.layers:
            src = layer(src)
        return self.norm(src) if self.norm is not None else src


def encoder(module: nn.TransformerEncoder) -> Encoder | None:
    layers = [encoder_layer(layer) for layer in module.layers]
    return Encoder(module, layers) if all(layers) else None  # type: ignore[arg-type]  # None excluded by all()


EXPANDERS: dict[type[nn.Module], Callable[[nn.Module], nn.Module | None]] = {
    nn.TransformerEncoder: encoder,  # type: ignore[dict-item]  # each expander takes its own type
    nn.TransformerEncoderLayer: encoder_layer,  # type: ignore[dict-item]
    nn.MultiheadAttention: multihead_attention,  # type: ignore[dict-item]
}


def expand(model: nn.Module) -> int:
    """Replace, in place, every module of `model` an expander covers (outermost first); how many were replaced. The
    model itself is never replaced: its caller holds it."""
    replaced = 0
    for name, child in list(model.named_children()):
        expander = EXPANDERS.get(type(child))
        written = expander(child) if expander is not None else None
        if written is not None:
            setattr(model, name, written)
            replaced += 1
        else:
            replaced += expand(child)
    return replaced
