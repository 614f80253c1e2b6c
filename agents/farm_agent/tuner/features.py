"""What a model looks like to the tuner's policy: its op mix, its sizes and the device it runs on.

One forward pass under a dispatch mode sees every ATen op the model runs. Matrix products and convolutions are
counted in FLOPs by PyTorch's own formulas (torch.utils.flop_counter); every other op is counted as one operation per
element it touches, by kind (normalisation, reduction, elementwise). The shares of these counts are the op mix.
Sizes are on log scales so that a linear policy can use them: total work, the fewest bytes the model must move
(inputs, parameters and outputs, each once) and their ratio, the arithmetic intensity.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward", "_efficient_attention_forward"}
CONV_OPS = {"convolution", "_convolution", "cudnn_convolution", "convolution_backward"}
NORM_OPS = {"native_layer_norm", "native_batch_norm", "_native_batch_norm_legit",
            "_native_batch_norm_legit_no_training", "native_group_norm", "_fused_rms_norm", "rms_norm", "layer_norm",
            "batch_norm", "group_norm", "instance_norm", "cudnn_batch_norm"}
REDUCTION_OPS = {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean", "prod",
                 "_softmax", "_log_softmax", "softmax", "log_softmax", "logsumexp", "norm", "linalg_vector_norm",
                 "cumsum", "cumprod", "topk", "sort", "avg_pool2d", "max_pool2d_with_indices", "adaptive_avg_pool2d",
                 "_adaptive_avg_pool2d", "avg_pool1d", "max_pool2d", "avg_pool3d", "max_pool3d_with_indices"}
# Ops that move no data through arithmetic (views, metadata): counted nowhere.
VIEW_OPS = {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze",
            "slice", "select", "as_strided", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind",
            "_reshape_alias", "empty", "empty_like", "empty_strided", "new_empty", "lift_fresh", "flatten",
            "unflatten", "view_as", "expand_as", "numpy_T", "contiguous"}

KINDS = ("matmul", "conv", "norm", "reduction", "elementwise")
FEATURE_NAMES = ("bias", *(f"share_{k}" for k in KINDS), "log_flops", "log_bytes", "log_intensity", "log_ops",
                 "device_cuda", "loose_tolerance")


@dataclass(frozen=True)
class ModelFeatures:
    """The context of one (model, inputs, tolerance, device): what the policy conditions on."""

    shares: dict[str, float]  # kind -> share of the model's counted operations
    flops: float  # matrix/conv FLOPs plus one per element touched by every other op
    min_bytes: float  # inputs + parameters + outputs, each moved once
    op_count: int  # ATen calls that do arithmetic
    device_kind: str  # "cuda" | "cpu"
    rtol: float

    @property
    def intensity(self) -> float:
        return self.flops / max(self.min_bytes, 1.0)

    def vector(self) -> list[float]:
        """Fixed-length, roughly unit-scaled numbers in FEATURE_NAMES order (a linear model's input)."""
        return [
            1.0,
            *(self.shares.get(kind, 0.0) for kind in KINDS),
            math.log10(max(self.flops, 1.0)) / 12.0,  # 1 TFLOP -> 1.0
            math.log10(max(self.min_bytes, 1.0)) / 10.0,  # 10 GB -> 1.0
            math.log10(max(self.intensity, 1e-3)) / 3.0,  # 1000 FLOP/byte -> 1.0
            math.log10(max(self.op_count, 1)) / 3.0,
            1.0 if self.device_kind == "cuda" else 0.0,
            # Whether precision may be lowered: 1e-4 -> 0, 1e-2 -> 1.
            min(max((math.log10(max(self.rtol, 1e-8)) + 4.0) / 2.0, 0.0), 1.0),
        ]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "intensity": self.intensity}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelFeatures:
        return cls(shares=dict(data["shares"]), flops=float(data["flops"]), min_bytes=float(data["min_bytes"]),
                   op_count=int(data["op_count"]), device_kind=str(data["device_kind"]), rtol=float(data["rtol"]))


def _numel(tensors: list[Any]) -> int:
    return sum(t.numel() for t in tensors if isinstance(t, torch.Tensor))


def _nbytes(tensors: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class _OpMix(TorchDispatchMode):
    """Counts each ATen call's work by kind while the model runs."""

    def __init__(self) -> None:
        super().__init__()
        self.work: Counter[str] = Counter()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in VIEW_OPS:
            return out
        self.ops += 1
        flat_in, _ = tree_flatten((args, kwargs))
        flat_out, _ = tree_flatten(out)
        packet = func.overloadpacket
        if packet in flop_registry and (name in MATMUL_OPS or name in CONV_OPS):
            flops = flop_registry[packet](*args, **kwargs, out_val=out)
            self.work["conv" if name in CONV_OPS else "matmul"] += flops
        elif name in NORM_OPS:
            self.work["norm"] += 5 * _numel(flat_in[:1])  # mean, variance, scale, shift per element
        elif name in REDUCTION_OPS:
            self.work["reduction"] += _numel(flat_in[:1])
        else:
            self.work["elementwise"] += max(_numel(flat_out), 1)
        return out


def model_features(model: torch.nn.Module, example_inputs: list[Any], rtol: float,
                   device: str | torch.device = "cpu") -> ModelFeatures:
    """Run the model once on `example_inputs` (already on its device) and describe it. Outside inference mode even
    where the caller is in it (a job's shard, where the tuner runs): there the dispatch mode sees `linear` and
    `conv2d` undecomposed, counted as elementwise, and an H100's tuned ConvNeXt job had no matrix products, so no
    `pytorch-defaults` baseline and no TF32 or autocast family."""
    mix = _OpMix()
    with torch.inference_mode(False), torch.no_grad(), mix:
        out = model(*example_inputs)
    total = sum(mix.work.values())
    shares = {kind: (mix.work[kind] / total if total else 0.0) for kind in KINDS}
    state = list(model.state_dict().values())
    outputs, _ = tree_flatten(out)
    min_bytes = _nbytes(list(example_inputs)) + _nbytes(state) + _nbytes(outputs)
    device_kind = "cuda" if torch.device(device).type == "cuda" else "cpu"
    return ModelFeatures(shares=shares, flops=float(total), min_bytes=float(min_bytes), op_count=mix.ops,
                         device_kind=device_kind, rtol=rtol)
