"""Candidate families: which apply where, that each CPU-buildable one computes the model's function, and that the
Triton pattern matcher rewrites what it should (its modules fall back to PyTorch on a CPU, so the rewritten model
is checked against the original here; the kernels themselves ran on the H200: docs/kernels-h200.md)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from farm_agent.tuner.candidates import build, candidates_for
from farm_agent.tuner.triton_kernels.rewrite import FusedLinearAct, TritonNorm, TritonSoftmax, count_matches, rewrite


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.down = nn.Linear(32, 8)
        self.rms = nn.RMSNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(nn.functional.gelu(self.up(x), approximate="tanh"))
        return torch.softmax(self.rms(self.down(h).relu()), dim=-1)


class Branchy(nn.Module):
    """fx cannot trace data-dependent control flow: the module walk takes over."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(16, 16), nn.SiLU(), nn.LayerNorm(16), nn.Softmax(dim=-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq(x) if x.sum() > 0 else -self.seq(-x)


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).relu()


def names(model: nn.Module, inputs: list[torch.Tensor], rtol: float, device: str) -> list[str]:
    return [c.name for c in candidates_for(model, inputs, rtol, device)]


def test_a_cpu_gets_no_gpu_only_candidates() -> None:
    assert names(Block().eval(), [torch.randn(4, 16)], 1e-2, "cpu") == [
        "eager", "compile-default", "compile-max-autotune"]


def test_precision_is_lowered_only_when_the_tolerance_allows_and_is_marked() -> None:
    model, inputs = Block().eval(), [torch.randn(4, 16)]
    strict = candidates_for(model, inputs, 1e-4, "cuda")
    # The baseline alone lowers precision at a strict tolerance: an untuned job runs PyTorch's defaults all the same.
    assert [c.name for c in strict if c.lowers_precision] == ["pytorch-defaults"]
    assert [c.name for c in strict] == ["eager", "pytorch-defaults", "compile-default", "compile-max-autotune",
                                        "compile-reduce-overhead", "cuda-graph", "triton-fused", "triton-templates",
                                        "triton-templates-3xtf32", "triton-templates-3xtf32-graph",
                                        "triton-templates-3xtf32-compile-graph", "triton-templates-compile"]
    tf32_only = names(model, inputs, 1e-3, "cuda")
    assert "tf32" in tf32_only and "autocast-fp16" not in tf32_only
    loose = candidates_for(model, inputs, 1e-2, "cuda")
    lowered = {c.name for c in loose if c.lowers_precision}
    assert lowered == {"pytorch-defaults", "tf32", "compile-tf32", "triton-fused-tf32", "triton-templates-tf32",
                       "autocast-bf16", "autocast-fp16", "compile-autocast-fp16", "triton-fused-fp16"}


def test_channels_last_only_for_convolutions_and_no_lowered_arithmetic_without_a_gemm() -> None:
    assert "channels-last" in names(Conv().eval(), [torch.randn(2, 3, 8, 8)], 1e-4, "cuda")
    assert "channels-last" not in names(Block().eval(), [torch.randn(4, 16)], 1e-4, "cuda")
    softmax_only = nn.Sequential(nn.Tanh(), nn.Softmax(dim=-1)).eval()
    assert names(softmax_only, [torch.randn(4, 16)], 1e-2, "cuda") == [
        "eager", "compile-default", "compile-max-autotune", "compile-reduce-overhead", "cuda-graph", "triton-fused",
        "triton-templates", "triton-templates-compile"]  # no 3xtf32/tf32 templates: they change only dots


def test_pairwise_distances_get_the_split_tf32_templates_too() -> None:
    class Distances(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.cdist(x, y)

    offered = names(Distances(), [torch.randn(40, 8), torch.randn(30, 8)], 1e-4, "cuda")
    assert {"triton-templates", "triton-templates-3xtf32"} <= set(offered)  # a distance region is a matrix product
    assert "triton-templates-tf32" in names(Distances(), [torch.randn(40, 8), torch.randn(30, 8)], 1e-2, "cuda")


def test_attention_gets_only_the_tensor_core_templates() -> None:
    class Attention(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return nn.functional.scaled_dot_product_attention(q, k, v)

    inputs = [torch.randn(2, 2, 20, 16) for _ in range(3)]
    offered = names(Attention(), inputs, 1e-4, "cuda")
    assert "triton-templates-3xtf32" in offered  # split-TF32 on the tensor cores
    assert "triton-templates" not in offered  # fp32 FMA attention: PyTorch's own kernels' ground


def test_the_matcher_fuses_linear_with_its_activation_and_swaps_norms_and_softmax() -> None:
    model = Block().eval()
    rewritten, counts = rewrite(model, "ieee")
    kinds = [type(m) for m in rewritten.modules()]
    assert counts == {"linear": 2, "norm": 2, "softmax": 1}
    assert kinds.count(FusedLinearAct) == 2 and kinds.count(TritonNorm) == 2 and kinds.count(TritonSoftmax) == 1
    assert {m.activation for m in rewritten.modules() if isinstance(m, FusedLinearAct)} == {"gelu_tanh", "relu"}
    x = torch.randn(5, 16)
    torch.testing.assert_close(rewritten(x), model(x))
    assert count_matches(model, "fp16") == 2  # lowering precision only changes the GEMMs


def test_the_module_walk_handles_models_fx_cannot_trace() -> None:
    model = Branchy().eval()
    rewritten, counts = rewrite(model, "ieee")
    assert counts == {"linear": 1, "norm": 1, "softmax": 1}
    assert isinstance(model.seq[0], nn.Linear)  # the original is left alone
    for x in (torch.randn(3, 16).abs(), -torch.randn(3, 16).abs()):
        torch.testing.assert_close(rewritten(x), model(x))


def test_built_candidates_compute_the_model_function_on_cpu() -> None:
    model, x = Block().eval(), torch.randn(6, 16)
    with torch.no_grad():
        expected = model(x)
        for transform in ("eager", "triton-fused"):
            torch.testing.assert_close(build(transform, model, [x], {})(x), expected)


class HostSync(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x  # the branch reads a value back to the host


class DataShaped(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0]  # as many outputs as positive inputs


def test_the_cuda_graph_families_refuse_what_one_static_graph_cannot_hold_with_a_reason() -> None:
    from farm_agent.tuner.candidates import build, graph_capture_refusal

    x = [torch.randn(4, 16)]
    assert graph_capture_refusal(Block().eval(), x) is None
    assert "host sync" in (graph_capture_refusal(HostSync(), x) or "")
    assert "data-dependent shape" in (graph_capture_refusal(DataShaped(), x) or "")
    for family in ("cuda-graph", "compile-reduce-overhead", "triton-templates-3xtf32-graph",
                   "triton-templates-3xtf32-compile-graph"):  # refused before anything touches CUDA
        with pytest.raises(ValueError, match="not capturable as a static CUDA graph: a host sync"):
            build(family, HostSync(), x, {})


def test_an_untuned_job_runs_pytorch_s_defaults_whatever_its_tolerance() -> None:
    """Strict fp32 (cuDNN's TF32 off) for a job at the default tolerance ran a ResNet job on the H200 at a quarter of a
    plain loop's rate: untuned, a job runs the model as PyTorch does by default, as the user's own loop would."""
    from farm_agent.tuner.candidates import Untuned

    torch.backends.cudnn.allow_tf32 = False  # whatever the process had set
    seen = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append((torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()))
            return x

    Untuned(Probe())(torch.zeros(1))
    assert seen == [(True, "highest")] and torch.backends.cudnn.allow_tf32 is False  # restored after
    torch.backends.cudnn.allow_tf32 = True


def test_where_the_tolerance_allows_tf32_an_untrained_search_tries_the_lowered_families_first() -> None:
    from farm_agent.tuner.candidates import untried_order

    model, inputs = Block().eval(), [torch.randn(4, 16)]
    strict = names(model, inputs, 1e-4, "cuda")
    assert untried_order(strict, 1e-4) == strict  # nothing lowered to try: FAMILIES order
    loose = names(model, inputs, 1e-2, "cuda")
    ordered = untried_order(loose, 1e-2)
    lowered = ["tf32", "compile-tf32", "triton-fused-tf32", "triton-templates-tf32", "autocast-bf16",
               "autocast-fp16", "compile-autocast-fp16", "triton-fused-fp16"]
    assert ordered[:len(lowered)] == lowered  # in FAMILIES order among themselves
    assert ordered.index("pytorch-defaults") > len(lowered)  # the baseline is measured anyway, not tried as a rival
    assert sorted(ordered) == sorted(loose)


def test_on_a_whole_model_an_untrained_search_tries_the_graph_families_first() -> None:
    from farm_agent.tuner.candidates import WHOLE_MODEL_OPS, untried_order

    offered = ["eager", "pytorch-defaults", "compile-default", "compile-reduce-overhead", "cuda-graph",
               "triton-templates", "triton-templates-3xtf32", "triton-templates-3xtf32-graph",
               "triton-templates-3xtf32-compile-graph"]
    assert untried_order(offered, 1e-4, op_count=1) == offered  # one operator: FAMILIES order
    whole = untried_order(offered, 1e-4, op_count=WHOLE_MODEL_OPS)
    assert whole[:4] == ["triton-templates-3xtf32-graph", "triton-templates-3xtf32-compile-graph", "cuda-graph",
                         "compile-reduce-overhead"]
    assert whole[4:] == ["eager", "pytorch-defaults", "compile-default", "triton-templates",
                         "triton-templates-3xtf32"]
    # Where TF32 is allowed, the lowered families still come first, then the graphs.
    assert untried_order([*offered, "tf32"], 1e-3, op_count=50)[:2] == ["tf32", "triton-templates-3xtf32-graph"]
