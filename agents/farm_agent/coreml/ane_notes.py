"""Where a converted model is not Neural-Engine friendly, and why: read from the converted program's ops and shapes.

These are the rules of Apple's "Deploying Transformers on the Apple Neural Engine" applied to what the converter
produced; on Linux they are the best available judgement. On a Mac, Core ML's compute plan (MLComputePlan, see
compute_plan.py) says which ops actually run on the Neural Engine, and that is what the node's offer uses.
"""

from __future__ import annotations

from farm_agent.coreml.package_info import FunctionInfo

# The ANE pads the last axis of every tensor to 64 bytes: 32 values in fp16.
ANE_ROW_VALUES = 32
COPY_OPS = ("transpose", "reshape")


def ane_notes(function: FunctionInfo) -> list[str]:
    """One sentence per obstacle found in `function` (one bucket of a converted model); empty when none."""
    notes = []
    integer_inputs = [t.name for t in function.inputs if not t.dtype.startswith("float")]
    if integer_inputs:
        gathers = function.op_counts.get("gather", 0) + function.op_counts.get("gather_nd", 0)
        notes.append(
            f"integer inputs ({', '.join(integer_inputs)}): the ANE computes in fp16, so expect the integer work (casts"
            + (f", {gathers} gather op(s) indexing by id" if gathers else "") + ") on the CPU"
        )
    short = [(op, shape) for op, shape in function.op_shapes if shape and shape[-1] < ANE_ROW_VALUES]
    if short:
        narrowest = min(shape[-1] for _, shape in short)
        notes.append(
            f"{len(short)} of {len(function.op_shapes)} computed ops produce tensors whose last axis is under "
            f"{ANE_ROW_VALUES} values (narrowest {narrowest}): the ANE pads the last axis to 64 bytes, so these take "
            f"up to {ANE_ROW_VALUES // max(narrowest, 1)}x their size in memory and bandwidth"
        )
    rank3_linear = sum(1 for op, shape in function.op_shapes if op in ("linear", "matmul") and len(shape) == 3)
    if rank3_linear:
        notes.append(
            f"{rank3_linear} linear/matmul op(s) on rank-3 (B, S, C) tensors: Apple's guidance is the (B, C, 1, S) "
            "layout with 1x1 convolutions, which the ANE runs natively"
        )
    attention = [shape for op, shape in function.op_shapes
                 if op == "softmax" and len(shape) == 4 and shape[1] > 1 and shape[2] == shape[3] > 1]
    if attention:
        notes.append(
            f"{len(attention)} softmax op(s) over all heads at once {attention[0]}: Apple's guidance splits attention "
            "per head so each chunk stays in the ANE's cache"
        )
    copies = {op: function.op_counts.get(op, 0) for op in COPY_OPS if function.op_counts.get(op, 0)}
    if copies:
        notes.append(
            " and ".join(f"{count} {op}" for op, count in copies.items())
            + " op(s): each is a memory copy on the ANE (Apple's guidance: keep them few)"
        )
    return notes
