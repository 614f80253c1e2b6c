"""templates.expand: PyTorch's composite modules written out as their ops, so that the fx matcher reaches the GEMMs,
attention and norms inside them. Each written-out module must compute what the original computes, share its
parameters, and leave to the original what it does not cover (masks, other attention forms)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from farm_agent.tuner.templates.expand import Encoder, EncoderLayer, expand
from farm_agent.tuner.templates.matcher import rewrite


def encoder(norm_first: bool, batch_first: bool, activation: str, final_norm: bool,
            heads: int = 4) -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, heads, 64, dropout=0.1, activation=activation, batch_first=batch_first,
                                       norm_first=norm_first)
    return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(32) if final_norm else None,
                                 enable_nested_tensor=False).eval()


class Classifier(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body, self.head = body, nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(1))


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_a_written_out_encoder_computes_what_pytorch_s_computes(norm_first: bool, batch_first: bool,
                                                                 activation: str) -> None:
    original = encoder(norm_first, batch_first, activation, final_norm=norm_first)
    model = Classifier(original).eval()
    x = torch.randn(5, 7, 32)  # (batch, length, width) or (length, batch, width): both are valid inputs
    with torch.no_grad():
        expected = model(x)
        assert expand(model) == 1
        assert isinstance(model.body, Encoder)
        assert all(isinstance(layer, EncoderLayer) for layer in model.body.layers)
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
    # The same parameters, not copies: the written-out model is the user's model.
    assert model.body.layers[0].attention.in_proj_weight is original.layers[0].self_attn.in_proj_weight


def test_a_call_with_a_mask_runs_pytorch_s_module() -> None:
    original = encoder(norm_first=True, batch_first=True, activation="gelu", final_norm=False)
    x, mask = torch.randn(2, 6, 32), torch.zeros(2, 6, dtype=torch.bool)
    mask[:, -2:] = True
    with torch.no_grad():
        expected = original(x, src_key_padding_mask=mask)
        holder = Classifier(original)
        expand(holder)
        torch.testing.assert_close(holder.body(x, src_key_padding_mask=mask), expected)


def test_attention_forms_it_does_not_cover_stay_pytorch_s() -> None:
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    layer.self_attn = nn.MultiheadAttention(32, 4, batch_first=True, add_bias_kv=True)
    holder = Classifier(layer)
    assert expand(holder) == 0
    assert holder.body is layer


def test_the_matcher_reaches_inside_a_transformer_encoder() -> None:
    # Two heads of 16: the attention template's smallest head.
    model = Classifier(encoder(norm_first=True, batch_first=True, activation="gelu", final_norm=True, heads=2)).eval()
    x = torch.randn(4, 16, 32)
    with torch.no_grad():
        expected = model(x)
        rewritten, counts = rewrite(model, [x], "tf32x3")
        # Before: the encoder was one leaf and only the head was a region.
        assert counts["attention"] == 2 and counts["gemm"] >= 7 and counts["rows"] >= 4, counts
        torch.testing.assert_close(rewritten(x), expected, rtol=1e-5, atol=1e-5)
    assert isinstance(model.body, nn.TransformerEncoder)  # the caller's model is left as it was


class SelfAttending(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 2, batch_first=batch_first)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.attn(x, x, x, need_weights=False)
        return out + x


@pytest.mark.parametrize("batch_first", [True, False])
def test_a_multihead_self_attention_is_written_out_and_other_calls_stay_pytorch_s(batch_first: bool) -> None:
    torch.manual_seed(0)
    model, x, y = SelfAttending(batch_first).eval(), torch.randn(3, 8, 32), torch.randn(3, 8, 32)
    with torch.no_grad():
        expected = model(x)
        weights_expected = model.attn(x, y, y)  # cross-attention, with its weights: not covered
        rewritten, counts = rewrite(model, [x], "tf32x3")
        assert counts["attention"] == 1 and counts["gemm"] >= 2, counts
        torch.testing.assert_close(rewritten(x), expected, rtol=1e-5, atol=1e-5)
        expand(model)
        out, weights = model.attn(x, y, y)
        torch.testing.assert_close(out, weights_expected[0])
        torch.testing.assert_close(weights, weights_expected[1])
