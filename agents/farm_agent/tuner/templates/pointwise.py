"""Elementwise graphs with no producer to join: one streamed pass over same-shape inputs.

What the anchored regions leave (an activation gate a * silu(b), a chain that reads its input at several points:
tanh(1.7x + 0.3) * sigmoid(x) - 0.25x², ...) is a small dataflow graph of elementwise ops over tensors of one shape.
A `Program` is that graph in SSA form: registers 0..inputs-1 are the input tensors, each next register one Step (the
epilogue's vocabulary: activations, clamps, binary ops with a number or with another register). The kernel loads
each input once, computes every register in fp32 and stores the last: each input byte is read once and the output
written once, with no intermediate in memory, in blocks of contiguous elements (the evict-first hint: streamed data
is not read again). On the H200 Inductor's pointwise kernels for such graphs ran at 63-72 % of the memory bandwidth
(docs/kernels-templates.md, the fourth run); eager's vectorised single ops at ~83 %.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from farm_agent.tuner.templates import codegen
from farm_agent.tuner.templates.epilogue import BINARY, BINARY_SOURCE, Step, reference, step_expression


@dataclass(frozen=True)
class Instruction:
    """Register `a` after `step`; `b`: the other register of a binary step whose operand is "full"."""

    step: Step
    a: int
    b: int | None = None

    def __post_init__(self) -> None:
        if (self.b is not None) != (self.step.op in BINARY and self.step.operand == "full"):
            raise ValueError("a second register goes with a binary step on a full operand, and only there")


@dataclass(frozen=True)
class Program:
    inputs: int
    body: tuple[Instruction, ...]

    def __post_init__(self) -> None:
        if self.inputs < 1 or not self.body:
            raise ValueError("a pointwise program reads at least one input and computes at least one value")
        for i, ins in enumerate(self.body):
            if not all(0 <= r < self.inputs + i for r in (ins.a, ins.b) if r is not None):
                raise ValueError(f"instruction {i} reads a register not yet computed")
            if ins.step.operand == "channel":
                raise ValueError("pointwise programs take no per-channel operands")

    def describe(self) -> str:
        return "+".join(ins.step.op for ins in self.body)


def torch_program(program: Program, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The program with PyTorch ops, one at a time (the CPU path and the tests' oracle)."""
    values = list(inputs)
    for ins in program.body:
        operands = [values[ins.b]] if ins.b is not None else []
        values.append(reference(values[ins.a], (ins.step,), operands, -1))
    return values[-1]


_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def kernel({inputs}Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
{loads}
{body}
    tl.store(Y + offs, v{last}, mask=mask)
'''


def source(program: Program) -> str:
    loads = [f'    v{i} = tl.load(X{i} + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)'
             for i in range(program.inputs)]
    body = []
    for i, ins in enumerate(program.body):
        # the epilogue's expression of the step on `acc` (and a register for a full operand), on this register
        expression = BINARY_SOURCE[ins.step.op].format(o=f"v{ins.b}") if ins.b is not None else \
            step_expression(ins.step)
        expression = re.sub(r"\bacc\b", f"v{ins.a}", expression)
        body.append(f"    v{program.inputs + i} = {expression}")
    return _SOURCE.format(inputs="".join(f"X{i}, " for i in range(program.inputs)), loads="\n".join(loads),
                          body="\n".join(body), last=program.inputs + len(program.body) - 1)


def plan() -> list[tuple[int, int]]:
    """(BLOCK, num_warps): the autotuning space; 16-32 elements a thread keep several 16-byte loads in flight."""
    return [(2048, 4), (4096, 4), (4096, 8), (8192, 8), (1024, 4)]


class PointwiseKernel:
    def __init__(self, program: Program) -> None:
        self.program = program
        self._kernel: Any = None

    def __call__(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        import triton

        first = inputs[0]
        if len(inputs) != self.program.inputs or any(t.shape != first.shape for t in inputs):
            raise ValueError("a pointwise program's inputs share one shape")
        if self._kernel is None:
            module = codegen.load_source(source(self.program), "pointwise")
            configs = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in plan()]
            self._kernel = codegen.autotuned(module.kernel, configs, ["N"])
        y = torch.empty(first.shape, device=first.device, dtype=torch.float32)
        n = first.numel()
        self._kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](*(t.contiguous() for t in inputs), y, n)
        return y
