"""The pattern matcher: finds Linear + activation, LayerNorm, RMSNorm and last-dimension softmax in a model and
rewrites them to Farm's Triton kernels.

torch.fx traces the model into a graph, where a Linear whose only user is an activation is found whatever the
code between modules looks like (a module, F.gelu, x.relu() ...). Models that fx cannot trace (data-dependent
control flow) get a module walk instead: norms and softmax modules anywhere, Linear + activation only as
neighbours in an nn.Sequential.

The replacement modules share the original parameters and fall back to PyTorch where Triton cannot run (CPU
tensors without TRITON_INTERPRET=1), so a rewritten model is always callable.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

Precision = str  # "ieee" | "tf32" | "fp16": the GEMM's arithmetic (linear_act.py)


def triton_runs_on(x: torch.Tensor) -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def _apply_activation(y: torch.Tensor, activation: str) -> torch.Tensor:
    functions: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "none": lambda t: t, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    }
    return functions[activation](y)


class FusedLinearAct(nn.Module):
    """act(linear(x)) as one Triton GEMM with the bias and activation in its epilogue."""

    def __init__(self, linear: nn.Linear, activation: str, precision: Precision) -> None:
        super().__init__()
        self.linear = linear
        self.activation = activation
        self.precision = precision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (triton_runs_on(x) and x.dtype == torch.float32 and self.linear.weight.dtype == torch.float32):
            return _apply_activation(self.linear(x), self.activation)
        from farm_agent.tuner.triton_kernels.linear_act import linear_act

        return linear_act(x, self.linear.weight, self.linear.bias, self.activation, self.precision)


class TritonNorm(nn.Module):
    """nn.LayerNorm or nn.RMSNorm over the last dimension through norm.py's kernel."""

    def __init__(self, module: nn.LayerNorm | nn.RMSNorm) -> None:
        super().__init__()
        self.module = module
        self.rms = isinstance(module, nn.RMSNorm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not triton_runs_on(x):
            return self.module(x)
        from farm_agent.tuner.triton_kernels.norm import norm

        eps = self.module.eps if self.module.eps is not None else torch.finfo(x.dtype).eps
        bias = getattr(self.module, "bias", None)
        return norm(x, self.module.weight, bias, eps, rms=self.rms)


class TritonSoftmax(nn.Module):
    """Softmax through softmax.py's kernel when `dim` is the last dimension; PyTorch's otherwise."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (triton_runs_on(x) and self.dim in (-1, x.dim() - 1)):
            return torch.softmax(x, dim=self.dim)
        from farm_agent.tuner.triton_kernels.softmax import softmax

        return softmax(x)


KIND: dict[type[nn.Module], str] = {FusedLinearAct: "linear", TritonNorm: "norm", TritonSoftmax: "softmax"}
ACTIVATION_MODULES: dict[type[nn.Module], str] = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Sigmoid: "sigmoid",
                                                   nn.Tanh: "tanh"}
ACTIVATION_FUNCTIONS: dict[Any, str] = {F.relu: "relu", torch.relu: "relu", F.silu: "silu", torch.sigmoid: "sigmoid",
                                        F.sigmoid: "sigmoid", torch.tanh: "tanh", F.tanh: "tanh", F.gelu: "gelu"}
ACTIVATION_METHODS = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh"}


def _module_activation(module: nn.Module) -> str | None:
    if isinstance(module, nn.GELU):
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    return ACTIVATION_MODULES.get(type(module))


def _node_activation(node: fx.Node, source: fx.Node, modules: dict[str, nn.Module]) -> str | None:
    """The activation `node` applies to `source`, if it is one that the GEMM epilogue can do."""
    if not node.args or node.args[0] is not source:
        return None
    if node.op == "call_module":
        return _module_activation(modules[str(node.target)])
    if node.op == "call_function" and node.target in ACTIVATION_FUNCTIONS and len(node.args) == 1:
        name = ACTIVATION_FUNCTIONS[node.target]
        if name == "gelu" and node.kwargs.get("approximate", "none") == "tanh":
            return "gelu_tanh"
        return name if set(node.kwargs) <= {"approximate", "inplace"} else None
    if node.op == "call_method" and node.target in ACTIVATION_METHODS and len(node.args) == 1 and not node.kwargs:
        return ACTIVATION_METHODS[str(node.target)]
    return None


def _softmax_dim(node: fx.Node, modules: dict[str, nn.Module]) -> int | None:
    if node.op == "call_module" and isinstance(modules[str(node.target)], nn.Softmax):
        dim = modules[str(node.target)].dim
        return dim if isinstance(dim, int) else None
    is_call = node.op == "call_function" and node.target in (F.softmax, torch.softmax)
    is_method = node.op == "call_method" and node.target == "softmax"
    if not (is_call or is_method) or set(node.kwargs) - {"dim"}:
        return None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return dim if isinstance(dim, int) and len(node.args) <= 2 else None


def _is_norm(module: nn.Module) -> bool:
    if isinstance(module, nn.LayerNorm | nn.RMSNorm):
        return len(tuple(module.normalized_shape)) == 1
    return False


def _rewrite_graph(model: nn.Module, precision: Precision) -> tuple[nn.Module, Counter[str]]:
    gm = fx.symbolic_trace(model)
    modules = dict(gm.named_modules())
    graph = gm.graph
    count: Counter[str] = Counter()

    def add(module: nn.Module) -> str:
        name = f"triton_fused_{count.total()}"
        gm.add_submodule(name, module)
        count[KIND[type(module)]] += 1
        return name

    for node in list(graph.nodes):
        module = modules.get(str(node.target)) if node.op == "call_module" else None
        if isinstance(module, nn.Linear) and len(node.args) == 1 and not node.kwargs:
            users = list(node.users)
            activation = _node_activation(users[0], node, modules) if len(users) == 1 else None
            # A bare GEMM in full fp32 is cuBLAS's ground: only a fused epilogue or lower precision can win it.
            if activation is None and precision == "ieee":
                continue
            replaced = users[0] if activation else node
            with graph.inserting_after(replaced):
                fused = graph.call_module(add(FusedLinearAct(module, activation or "none", precision)), node.args)
            replaced.replace_all_uses_with(fused)
            if activation:
                graph.erase_node(users[0])
            graph.erase_node(node)
        elif module is not None and _is_norm(module):
            node.target = add(TritonNorm(module))  # type: ignore[arg-type]
        elif (dim := _softmax_dim(node, modules)) is not None:
            with graph.inserting_after(node):
                replacement = graph.call_module(add(TritonSoftmax(dim)), (node.args[0],))
            node.replace_all_uses_with(replacement)
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm, count


def _rewrite_modules(model: nn.Module, precision: Precision) -> tuple[nn.Module, Counter[str]]:
    """For models fx cannot trace: rewrite in place, module by module."""
    count: Counter[str] = Counter()
    for parent in list(model.modules()):
        children = list(parent.named_children())
        for i, (name, child) in enumerate(children):
            if _is_norm(child):
                setattr(parent, name, TritonNorm(child))  # type: ignore[arg-type]
                count["norm"] += 1
            elif isinstance(child, nn.Softmax) and isinstance(child.dim, int):
                setattr(parent, name, TritonSoftmax(child.dim))
                count["softmax"] += 1
            elif isinstance(parent, nn.Sequential) and isinstance(child, nn.Linear) and i + 1 < len(children):
                next_name, next_child = children[i + 1]
                activation = _module_activation(next_child)
                if activation is not None:
                    setattr(parent, name, FusedLinearAct(child, activation, precision))
                    setattr(parent, next_name, nn.Identity())
                    count["linear"] += 1
    return model, count


def rewrite(model: nn.Module, precision: Precision = "ieee") -> tuple[nn.Module, Counter[str]]:
    """A copy of `model` whose matching parts run Farm's Triton kernels, and how many parts of each kind (linear,
    norm, softmax) were rewritten."""
    try:
        return _rewrite_graph(model, precision)
    except (fx.proxy.TraceError, TypeError, NotImplementedError, RuntimeError, AttributeError):
        return _rewrite_modules(copy.deepcopy(model), precision)


def count_matches(model: nn.Module, precision: Precision = "ieee") -> int:
    """Parts of `model` the Triton kernels would run. Lowering the precision changes only the GEMM, so for "tf32"
    and "fp16" only Linear matches count."""
    counts = rewrite(model, precision)[1]
    return counts.total() if precision == "ieee" else counts["linear"]
