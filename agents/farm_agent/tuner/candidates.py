"""The candidate implementations the tuner chooses among, and `build`, which makes one of them from a model.

A candidate is a named transform of the job's own model (no new code to trust): eager, torch.compile in three
modes, CUDA graph capture, TF32 / bf16 / fp16 arithmetic (only offered when the tolerance allows, and marked
`lowers_precision`), channels_last with cudnn.benchmark for convolutions, Farm's Triton kernels (triton_kernels/)
and its template kernels (templates/: the fx matcher's regions, implicit-GEMM convolutions, GEMMs with epilogues,
pooling, row reductions). The evaluator's worker calls `build` in its own process, so building may compile and capture.

The template families' precisions: "ieee" is fp32 FMA arithmetic; "tf32x3" is split-TF32 on the tensor cores
(each product as three TF32 products that keep the low bits: fp32-level error, so it does not lower precision,
though the tables mark it with a dagger so that a reader can tell it from ieee); "tf32" is one TF32 product and
lowers precision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from farm_agent.tuner.evaluator import Candidate
from farm_agent.tuner.features import model_features

Built = Callable[..., Any]

# Relative errors these arithmetics typically leave on fp32 work (float32 ~1e-6, tf32 ~3e-4, fp16 ~1e-3, bf16 ~4e-3):
# a candidate is offered only when the tolerance is comfortably above its error.
TF32_MIN_RTOL = 1e-3
HALF_MIN_RTOL = 5e-3


@dataclass(frozen=True)
class Family:
    """One kind of candidate: how to build it and when it applies."""

    name: str
    needs_cuda: bool = False
    lowers_precision: bool = False
    min_rtol: float = 0.0
    needs_conv: bool = False
    needs_gemm: bool = False  # the lowered arithmetic (TF32, autocast) touches only matrix products and convolutions
    needs_triton_match: bool = False
    needs_template: str | None = None  # a template region of these kinds: "any" or "dot" (DOT_REGIONS)
    params: tuple[tuple[str, Any], ...] = ()


FAMILIES: tuple[Family, ...] = (
    Family("eager"),
    # The model as an untuned job runs it where its tolerance allows TF32: PyTorch's default flags (cuDNN's
    # convolutions in TF32, matrix products in fp32). The evaluator starts a candidate that lowers precision from
    # those defaults (worker.precision_flags), so building it is the model itself.
    # The baseline, at any tolerance: what an untuned job runs (untuned_precision). Where the tolerance is below
    # TF32's error it is measured but never a winner (choose: only the baseline may miss the tolerance).
    Family("pytorch-defaults", needs_cuda=True, lowers_precision=True, needs_gemm=True),
    Family("compile-default"),
    Family("compile-max-autotune"),
    Family("compile-reduce-overhead", needs_cuda=True),
    Family("cuda-graph", needs_cuda=True),
    Family("channels-last", needs_cuda=True, needs_conv=True),
    Family("triton-fused", needs_cuda=True, needs_triton_match=True, params=(("precision", "ieee"),)),
    Family("triton-templates", needs_cuda=True, needs_template="any", params=(("precision", "ieee"),)),
    Family("triton-templates-3xtf32", needs_cuda=True, needs_template="dot", params=(("precision", "tf32x3"),)),
    # Whole models: the templates' regions with the rest of the forward left to eager or to Inductor, the lot
    # captured as one CUDA graph, which removes the launches between them (each refuses a model one static graph
    # cannot hold, as cuda-graph does).
    Family("triton-templates-3xtf32-graph", needs_cuda=True, needs_template="dot",
           params=(("precision", "tf32x3"),)),
    Family("triton-templates-3xtf32-compile-graph", needs_cuda=True, needs_template="dot",
           params=(("precision", "tf32x3"),)),
    Family("triton-templates-compile", needs_cuda=True, needs_template="any", params=(("precision", "ieee"),)),
    Family("tf32", needs_cuda=True, lowers_precision=True, min_rtol=TF32_MIN_RTOL, needs_gemm=True),
    Family("compile-tf32", needs_cuda=True, lowers_precision=True, min_rtol=TF32_MIN_RTOL, needs_gemm=True),
    Family("triton-fused-tf32", needs_cuda=True, lowers_precision=True, min_rtol=TF32_MIN_RTOL,
           needs_triton_match=True, params=(("precision", "tf32"),)),
    Family("triton-templates-tf32", needs_cuda=True, lowers_precision=True, min_rtol=TF32_MIN_RTOL,
           needs_template="dot", params=(("precision", "tf32"),)),
    Family("autocast-bf16", needs_cuda=True, lowers_precision=True, min_rtol=HALF_MIN_RTOL, needs_gemm=True),
    Family("autocast-fp16", needs_cuda=True, lowers_precision=True, min_rtol=HALF_MIN_RTOL, needs_gemm=True),
    Family("compile-autocast-fp16", needs_cuda=True, lowers_precision=True, min_rtol=HALF_MIN_RTOL, needs_gemm=True),
    Family("triton-fused-fp16", needs_cuda=True, lowers_precision=True, min_rtol=HALF_MIN_RTOL,
           needs_triton_match=True, params=(("precision", "fp16"),)),
)
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}
# The region kinds whose templates compute matrix products (the only work tf32x3 and tf32 change).
DOT_REGIONS = ("conv", "gemm", "distance", "attention", "recurrence")
BASELINES = ("eager", "compile-default")  # always measured: every speedup is reported against them
# What the job runs when no candidate beats it (farm_agent.tuner.tune.baseline_for): run untuned, not built.
UNTUNED = frozenset({"eager", "pytorch-defaults"})
# Families whose fp32 result comes from split-TF32 products (see the module's docstring): marked in tables.
EMULATED_FP32 = frozenset({"triton-templates-3xtf32", "triton-templates-3xtf32-graph",
                           "triton-templates-3xtf32-compile-graph"})


def has_convolution(model: nn.Module) -> bool:
    """A 2-d convolution: channels_last is a layout of 4-d tensors (a Conv3d's input cannot take it)."""
    return any(isinstance(m, nn.Conv2d | nn.ConvTranspose2d) for m in model.modules())


def candidates_for(model: nn.Module, example_inputs: Sequence[Any], tolerance: float,
                   device: str | torch.device) -> list[Candidate]:
    """Every candidate that applies to this model, tolerance (the rtol a result must meet) and device."""
    from farm_agent.tuner.triton_kernels import count_matches

    on_cuda = torch.device(device).type == "cuda"
    conv = has_convolution(model)
    gemm: bool | None = None  # found out (one forward pass) only if a family asks
    regions: dict[str, dict[str, int]] = {}  # precision -> region kind -> count, found out only if a family asks
    found: list[Candidate] = []
    for family in FAMILIES:
        params = dict(family.params)
        if family.needs_cuda and not on_cuda:
            continue
        if family.needs_conv and not conv:
            continue
        if family.needs_gemm:
            if gemm is None:
                shares = model_features(model, list(example_inputs), tolerance, device).shares
                gemm = shares["matmul"] + shares["conv"] > 0
            if not gemm:
                continue
        if tolerance < family.min_rtol:
            continue
        if family.needs_triton_match and count_matches(model, params.get("precision", "ieee")) == 0:
            continue
        if family.needs_template:
            precision = params["precision"]
            if precision not in regions:
                regions[precision] = template_regions(model, example_inputs, precision)
            kinds = regions[precision]
            if not template_wanted(family.needs_template, kinds):
                continue
        found.append(Candidate(name=family.name, transform=family.name, params=params,
                               lowers_precision=family.lowers_precision))
    return found


# A model of this many arithmetic ops (features.op_count) is launch-bound enough for one CUDA graph to matter: the
# whole models measured have 10 to 3,594, the single-operator problems 1 to 11 (benchmarks/kernels).
WHOLE_MODEL_OPS = 10
# The graph families, in the order an untrained search tries them on a whole model. On the 13-model suite (H100,
# docs/h100-2026-12-06-e.md) they made 12 of the 13 strict time picks (11 the split-TF32 templates captured, one
# cuda-graph); the templates captured without Inductor came within 1-6 % of those with it, at a fraction of the build.
GRAPH_FIRST = ("triton-templates-3xtf32-graph", "triton-templates-3xtf32-compile-graph", "cuda-graph",
               "compile-reduce-overhead")


def untried_order(names: Sequence[str], tolerance: float, op_count: int = 1) -> list[str]:
    """`names` in the order an untrained policy tries them (its ties keep the order given), FAMILIES order but:
    - where the tolerance allows TF32, the families that lower precision come first. The user has said the error is
      acceptable, and lowered arithmetic is the largest gain on matrix products; in FAMILIES order they came last,
      and a 45 s run on a ConvNeXt at 1e-3 reached none of them (lease M);
    - on a whole model (`op_count` ops or more: WHOLE_MODEL_OPS), the graph families come next (GRAPH_FIRST)."""
    lowered = [n for n in names if tolerance >= TF32_MIN_RTOL and n in FAMILY_BY_NAME
               and FAMILY_BY_NAME[n].lowers_precision and n not in UNTUNED]
    graphs = [n for n in GRAPH_FIRST if n in names] if op_count >= WHOLE_MODEL_OPS else []
    return [*lowered, *graphs, *(n for n in names if n not in lowered and n not in graphs)]


def template_wanted(needs: str, kinds: dict[str, int]) -> bool:
    """Whether region counts by kind give a template family (needs "any" region or a "dot" one) work to do."""
    return sum(n for kind, n in kinds.items() if needs == "any" or kind in DOT_REGIONS) > 0


def template_regions(model: nn.Module, example_inputs: Sequence[Any], precision: str) -> dict[str, int]:
    """How many regions of each kind the template matcher finds in `model` (none where it cannot run it)."""
    from farm_agent.tuner.templates.matcher import rewrite as template_rewrite

    try:
        return dict(template_rewrite(model, list(example_inputs), precision)[1])
    except Exception:  # a model the matcher cannot even run for its shapes: no template candidates
        return {}


def candidate(name: str) -> Candidate:
    """The candidate of one family by name (eager, compile-default, ...)."""
    family = FAMILY_BY_NAME[name]
    return Candidate(name=name, transform=name, params=dict(family.params), lowers_precision=family.lowers_precision)


# --- building --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@contextlib.contextmanager
def precision_flags(cudnn_tf32: bool) -> Iterator[None]:
    """PyTorch's precision flags as the evaluator's worker starts a candidate from (worker.precision_flags): cuDNN's
    TF32 as given, matrix products in fp32; restored on exit."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])


def untuned_precision() -> contextlib.AbstractContextManager[None]:
    """The precision an untuned job runs at: PyTorch's defaults (cuDNN convolutions in TF32, matrix products in
    fp32), as the user's own loop runs the model, whatever the job's tolerance; the tolerance bounds what the tuner may
    change, not the model as written. Strict fp32 for every untuned job ran a ResNet job on the H200 at a quarter of
    a plain loop's rate. The tuner's baseline is the same (pytorch-defaults; eager where there is no GEMM)."""
    return precision_flags(cudnn_tf32=True)


class Untuned:
    """The model as an untuned job runs it (untuned_precision)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, *inputs: Any) -> Any:
        with untuned_precision():
            return self.model(*inputs)


def as_measured(fn: Built, lowers_precision: bool) -> Built:
    """A built candidate under the flags the evaluator measured it from: PyTorch's defaults for one that lowers
    precision, strict fp32 otherwise (a family that needs other flags sets them itself, inside these)."""
    def run(*inputs: Any) -> Any:
        with precision_flags(cudnn_tf32=lowers_precision):
            return fn(*inputs)
    return run


def _to_float32(out: Any) -> Any:
    """Half-precision outputs back to fp32, so that the result has the reference's type."""
    return tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16)
                    else t, out)


def _with_fp32(fn: Built) -> Built:
    """Full fp32 arithmetic: cuDNN's convolutions default to TF32 in PyTorch, which a candidate that does not say it
    lowers precision must not use."""
    def run(*inputs: Any) -> Any:
        with _tf32(False):
            return fn(*inputs)
    return run


def _with_tf32(fn: Built) -> Built:
    def run(*inputs: Any) -> Any:
        with _tf32(True):
            return fn(*inputs)
    return run


def _with_autocast(fn: Built, dtype: torch.dtype) -> Built:
    def run(*inputs: Any) -> Any:
        with torch.autocast("cuda", dtype=dtype):
            return _to_float32(fn(*inputs))
    return run


class _Graphed:
    """Eager forward captured once into a CUDA graph; each call copies the inputs in and replays it.

    The graph holds raw pointers to the model's weights and its own buffers, so this object keeps the model, the
    static inputs and the static output alive as long as the graph. The output buffer is overwritten by the next
    replay, so each call returns a copy of it.
    """

    def __init__(self, model: Built, example_inputs: Sequence[Any]) -> None:
        self.model = model
        self.static_inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in example_inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(3):  # warm-up on a side stream, as capture requires (lazy init, cuBLAS workspaces)
                model(*self.static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.static_out = model(*self.static_inputs)

    def __call__(self, *inputs: Any) -> Any:
        for buffer, x in zip(self.static_inputs, inputs, strict=True):
            if isinstance(buffer, torch.Tensor):
                buffer.copy_(x)
        self.graph.replay()
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self.static_out)


# Ops whose output's shape depends on the data (a captured graph replays fixed shapes), and the op behind every
# device-to-host read (.item(), .tolist(), a tensor in an `if`): a host sync, which a capture cannot hold.
_DATA_DEPENDENT_SHAPES = frozenset({"nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
                                    "argwhere", "repeat_interleave"})
_HOST_READS = frozenset({"_local_scalar_dense"})


def _mask_index(name: str, args: Any) -> bool:
    """x[mask]: indexing by a boolean tensor keeps as many rows as the mask has True values."""
    return name.startswith("index") and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                            for i in tree_leaves(list(args[1:])))


def graph_capture_refusal(model: nn.Module, example_inputs: Sequence[Any]) -> str | None:
    """Why `model` cannot be captured as one static CUDA graph, or None: one forward on the example inputs (on any
    device: this runs on a CPU) watched op by op for data-dependent shapes and host syncs, and for outputs whose
    shapes differ between two batches of the same shape."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.reason: str | None = None

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = func._overloadpacket.__name__
            if self.reason is None and name in _HOST_READS:
                self.reason = "a host sync (.item(), .tolist() or a tensor's value in Python control flow)"
            elif self.reason is None and (name in _DATA_DEPENDENT_SHAPES or _mask_index(name, args)):
                self.reason = f"a data-dependent shape ({name})"
            return func(*args, **(kwargs or {}))

    shapes = []
    with torch.no_grad():
        for scale in (1.0, -0.5):  # two batches of one shape, different values
            batch = [x * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in example_inputs]
            with Watch() as watch:
                out = model(*batch)
            if watch.reason is not None:
                return f"not capturable as a static CUDA graph: {watch.reason}"
            shapes.append([tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
    return None if shapes[0] == shapes[1] else "not capturable as a static CUDA graph: output shapes follow the data"


def _graphed_fp32(model: nn.Module, example_inputs: Sequence[Any],
                  transform: Callable[[nn.Module], Built] | None = None) -> Built:
    """`model`, or `transform(model)`, captured as one CUDA graph; refused where `model` cannot be one (the check
    runs the user's model: the transforms here compute the same ops, and a compiled one must not be traced by it)."""
    if (refusal := graph_capture_refusal(model, example_inputs)) is not None:
        raise ValueError(refusal)
    with _tf32(False):  # the graph keeps the kernels chosen while capturing (and Inductor's): choose fp32 ones
        return _Graphed(transform(model) if transform is not None else model, example_inputs)


def _reduce_overhead(model: nn.Module, example_inputs: Sequence[Any]) -> Built:
    """torch.compile's CUDA-graph mode. Its outputs live in the graph's memory pool and the next replay overwrites
    them, so each call marks a new step and returns copies. Refused, like cuda-graph, for a model that cannot be one
    static graph (Inductor would otherwise split it silently and replay little)."""
    if (refusal := graph_capture_refusal(model, example_inputs)) is not None:
        raise ValueError(refusal)
    compiled = torch.compile(model, mode="reduce-overhead")

    def run(*inputs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, compiled(*inputs))

    return run


def _channels_last(model: nn.Module) -> Built:
    """NHWC weights and inputs (the layout cuDNN's tensor-core convolutions want), with cudnn.benchmark choosing
    each convolution's algorithm by timing it at these shapes; the switch is on only during this candidate's calls,
    so that it does not leak into whatever runs next in the process."""
    model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stub omits it

    def run(*inputs: Any) -> Any:
        saved = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            return model(*(x.contiguous(memory_format=torch.channels_last)
                           if isinstance(x, torch.Tensor) and x.dim() == 4 else x for x in inputs))
        finally:
            torch.backends.cudnn.benchmark = saved

    return run


def _triton_fused(model: nn.Module, precision: str) -> Built:
    from farm_agent.tuner.triton_kernels import rewrite

    rewritten, counts = rewrite(model, precision)
    if counts.total() == 0:
        raise ValueError("no submodule of this model matches a Triton kernel's pattern")
    return rewritten


def _templates(model: nn.Module, example_inputs: list[Any], precision: str) -> nn.Module:
    from farm_agent.tuner.templates.matcher import rewrite as template_rewrite

    rewritten, counts = template_rewrite(model, example_inputs, precision)
    if counts.total() == 0:
        raise ValueError("no region of this model matches a template")
    return rewritten


def build(transform: str, model: nn.Module, example_inputs: list[Any], params: dict[str, Any]) -> Built:
    """The candidate `transform` of `model`: something called like model(*inputs)."""
    model = model.eval()
    # The other families that keep fp32 arithmetic run with TF32 off (_with_fp32, _graphed_fp32).
    builders: dict[str, Callable[[], Built]] = {
        "eager": lambda: model,
        "pytorch-defaults": lambda: model,
        # The baseline exactly as users get it (PyTorch's defaults: cuDNN may use TF32), like the evaluator's eager.
        "compile-default": lambda: torch.compile(model),
        "compile-max-autotune": lambda: _with_fp32(torch.compile(model, mode="max-autotune-no-cudagraphs")),
        "compile-reduce-overhead": lambda: _with_fp32(_reduce_overhead(model, example_inputs)),
        "cuda-graph": lambda: _graphed_fp32(model, example_inputs),
        "channels-last": lambda: _with_fp32(_channels_last(model)),
        "triton-fused": lambda: _with_fp32(_triton_fused(model, "ieee")),
        "triton-fused-tf32": lambda: _with_tf32(_triton_fused(model, "tf32")),
        "triton-fused-fp16": lambda: _triton_fused(model, "fp16"),
        "triton-templates": lambda: _with_fp32(_templates(model, example_inputs, "ieee")),
        "triton-templates-3xtf32": lambda: _with_fp32(_templates(model, example_inputs, "tf32x3")),
        "triton-templates-3xtf32-graph": lambda: _graphed_fp32(
            model, example_inputs, lambda m: _templates(m, example_inputs, "tf32x3")),
        "triton-templates-3xtf32-compile-graph": lambda: _graphed_fp32(
            model, example_inputs, lambda m: torch.compile(_templates(m, example_inputs, "tf32x3"))),
        # The rest of the model to Inductor; each region is a graph break (TemplateRegion.forward).
        "triton-templates-compile": lambda: _with_fp32(torch.compile(_templates(model, example_inputs, "ieee"))),
        "triton-templates-tf32": lambda: _with_tf32(_templates(model, example_inputs, "tf32")),
        "tf32": lambda: _with_tf32(model),
        # Inductor reads the TF32 switch while it compiles: the wrapper keeps it on for the first call too.
        "compile-tf32": lambda: _with_tf32(torch.compile(model)),
        "autocast-bf16": lambda: _with_autocast(model, torch.bfloat16),
        "autocast-fp16": lambda: _with_autocast(model, torch.float16),
        "compile-autocast-fp16": lambda: torch.compile(_with_autocast(model, torch.float16)),
    }
    if transform not in builders:
        raise ValueError(f"unknown transform {transform!r}; known: {', '.join(builders)}")
    return builders[transform]()
