"""Elementwise graphs (templates.pointwise) that no anchored region took: matched after them, by `fuse`.

Not a finder of FINDERS: an elementwise op is also what a chain after an anchor and a row op's prologue are made of,
and those, fused into their producer's or consumer's kernel, save more. So the matcher runs `fuse` once the anchored
regions are rewritten, over the elementwise nodes left."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import fx, nn

from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.pointwise import Instruction, PointwiseKernel, Program, torch_program
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, shape_of

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher

# Below this many elements a kernel's launch (the host's ~0.1 ms a template call) costs more than the intermediate
# tensors' memory traffic it saves.
MIN_ELEMENTS = 1 << 16
MIN_OPS = 2  # one op alone is what eager's or Inductor's own elementwise kernel runs already


class PointwiseRegion(TemplateRegion):
    """forward(*the program's inputs): its last register."""

    kind = "pointwise"

    def __init__(self, program: Program) -> None:
        super().__init__((), (), program.inputs, -1)
        self.program = program
        self.kernel = PointwiseKernel(program)

    def produce(self, *inputs: torch.Tensor) -> torch.Tensor:
        return torch_program(self.program, inputs)

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> torch.Tensor:
        return self.kernel(inputs)

    def describe(self) -> str:
        return f"pointwise {self.program.describe()}"


Classified = tuple[Step, fx.Node, fx.Node | None]  # the step, the register it applies to, its other register


def _classify(matcher: Matcher, node: fx.Node, stub: Anchor) -> Classified | None:
    """The elementwise step `node` applies to one fp32 tensor of its own shape, with at most one other such tensor
    or a number (matcher.step's vocabulary, no per-channel operands); None for anything else."""
    if node.op not in ("call_function", "call_method", "call_module") or dtype_of(node) != torch.float32:
        return None
    shape = shape_of(node)
    tensors = [a for a in [*node.args, *node.kwargs.values()] if isinstance(a, fx.Node)]
    tail = next((a for a in tensors if shape_of(a) == shape and dtype_of(a) == torch.float32), None)
    if shape is None or tail is None:
        return None
    step, operand = matcher.step(node, tail, stub)
    if step is None or isinstance(operand, nn.Module) or any(a not in (tail, operand) for a in tensors):
        return None
    return step, tail, operand


def fuse(matcher: Matcher, count: Counter[str]) -> Counter[str]:
    """Rewrite each largest graph of elementwise nodes with one output (each node but the last read only inside it)
    into a PointwiseRegion, where it has MIN_OPS nodes and MIN_ELEMENTS elements or more. `count`: the regions
    rewritten before (their names continue from it). Returns the pointwise regions' count."""
    graph = matcher.gm.graph
    stub = Anchor("pointwise", [], -1, lambda chain, sources: None,  # type: ignore[arg-type,return-value]
                  allows_channel=False)
    classified = {node: c for node in graph.nodes if (c := _classify(matcher, node, stub)) is not None}
    taken: set[fx.Node] = set()
    made: Counter[str] = Counter()
    for sink in reversed(list(graph.nodes)):
        shape = shape_of(sink)
        if sink not in classified or sink in taken or shape is None or math.prod(shape) < MIN_ELEMENTS:
            continue
        members = {sink}
        grown = True
        while grown:  # take each producer that only members read
            grown = False
            for member in list(members):
                for arg in classified[member][1:]:
                    if isinstance(arg, fx.Node) and arg in classified and arg not in members and arg not in taken \
                            and shape_of(arg) == shape and all(user in members for user in arg.users):
                        members.add(arg)
                        grown = True
        if len(members) < MIN_OPS:
            continue
        order = [n for n in graph.nodes if n in members]
        leaves: list[fx.Node] = []
        for node in order:
            for arg in classified[node][1:]:
                if isinstance(arg, fx.Node) and arg not in members and arg not in leaves:
                    leaves.append(arg)
        register = {node: i for i, node in enumerate([*leaves, *order])}
        body = []
        for node in order:
            step, tail, operand = classified[node]
            body.append(Instruction(step, register[tail], register[operand] if operand is not None else None))
        region = PointwiseRegion(Program(len(leaves), tuple(body)))
        name = f"farm_template_{sum(count.values()) + sum(made.values())}"
        matcher.gm.add_submodule(name, region)
        with graph.inserting_after(sink):
            call = graph.call_module(name, tuple(leaves))
        call.meta = dict(sink.meta)
        sink.replace_all_uses_with(call)
        for node in reversed(order):
            graph.erase_node(node)
        taken |= members
        made[region.kind] += 1
    return made
