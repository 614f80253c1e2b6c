"""How much of a converted model Core ML would run on the Neural Engine: its compute plan (macOS 14.4+ only).

`MLComputePlan` gives, for each op of a compiled model, the device Core ML prefers for it and the op's estimated
share of the model's work. The share that matters is the work on the ANE, not the op count: a model whose convs run
on the ANE and whose few casts run on the CPU is an ANE model. Where Core ML gives no costs, ops are counted.

`summarise` is pure and tested on any OS; `compute_plan` needs Core ML's runtime (it raises elsewhere).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# The node offers `ane` for a model only when at least this share of its work would run on the Neural Engine.
MIN_ANE_SHARE = 0.5

# MLComputePlan's device classes (coremltools.models.compute_device) by the name Farm uses.
DEVICE_OF_CLASS = {
    "MLNeuralEngineComputeDevice": "ane",
    "MLGPUComputeDevice": "gpu",
    "MLCPUComputeDevice": "cpu",
}
NOT_PLACED = {"const"}  # constants are not executed on any device


@dataclass(frozen=True)
class OpPlacement:
    op: str  # the operator's name: conv, linear, softmax...
    device: str  # ane | gpu | cpu | unknown
    cost: float | None  # the op's estimated share of the model's work (0-1), None when Core ML gave none


@dataclass(frozen=True)
class PlanSummary:
    ops: int
    by_device: dict[str, int]  # op counts per device
    ane_share: float  # share of the estimated work on the ANE (of the op count, where costs are missing)
    weighted: bool  # True when ane_share is cost-weighted
    off_ane: dict[str, int]  # op types that do not run on the ANE, with counts: what to look at

    @property
    def mostly_ane(self) -> bool:
        return self.ane_share >= MIN_ANE_SHARE

    def describe(self) -> str:
        basis = "of the estimated work" if self.weighted else "of the ops"
        text = f"{100 * self.ane_share:.0f}% {basis} on the Neural Engine (MLComputePlan)"
        if self.off_ane:
            text += "; off it: " + ", ".join(f"{op} x{n}" for op, n in self.off_ane.items())
        return text


def device_name(device: object) -> str:
    return DEVICE_OF_CLASS.get(type(device).__name__, "unknown")


def summarise(placements: Iterable[OpPlacement]) -> PlanSummary:
    placed = [p for p in placements if p.op not in NOT_PLACED]
    by_device = Counter(p.device for p in placed)
    off = Counter(p.op for p in placed if p.device != "ane")
    costs = [p.cost for p in placed]
    weighted = bool(placed) and all(c is not None for c in costs) and sum(c or 0.0 for c in costs) > 0
    if weighted:
        total = sum(p.cost or 0.0 for p in placed)
        share = sum(p.cost or 0.0 for p in placed if p.device == "ane") / total
    else:
        share = by_device.get("ane", 0) / len(placed) if placed else 0.0
    return PlanSummary(ops=len(placed), by_device=dict(by_device), ane_share=share, weighted=weighted,
                       off_ane=dict(off.most_common()))


def placements(plan: object, function: str) -> list[OpPlacement]:
    """Each op of `function` in an MLComputePlan, with its preferred device and cost."""
    program = plan.model_structure.program  # type: ignore[attr-defined]
    if program is None:
        raise ValueError("the compute plan is not an ML Program's")
    found = []
    for op in program.functions[function].block.operations:
        if op.operator_name in NOT_PLACED:
            continue
        usage = plan.get_compute_device_usage_for_mlprogram_operation(op)  # type: ignore[attr-defined]
        cost = plan.get_estimated_cost_for_mlprogram_operation(op)  # type: ignore[attr-defined]
        found.append(OpPlacement(
            op=op.operator_name, device=device_name(usage.preferred_compute_device) if usage else "unknown",
            cost=cost.weight if cost else None,
        ))
    return found


def compute_plan(package: Path, function: str, compute_units: str = "CPU_AND_NE") -> PlanSummary:
    """The compute plan of one function (batch bucket) of a converted package. macOS only."""
    if sys.platform != "darwin":
        raise RuntimeError(f"MLComputePlan needs Core ML's runtime (macOS 14.4+), and this is {sys.platform}")
    import coremltools as ct
    from coremltools.models.compute_plan import MLComputePlan

    compiled = ct.models.utils.compile_model(str(package))
    plan = MLComputePlan.load_from_path(compiled, compute_units=ct.ComputeUnit[compute_units])
    return summarise(placements(plan, function))
