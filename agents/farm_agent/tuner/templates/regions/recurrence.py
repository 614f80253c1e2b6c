"""Recurrent layers (templates.recurrence): nn.GRU and nn.LSTM called on a batch of sequences without an initial
state, every layer and direction, returning what the module returns ((output, h_n), or (output, (h_n, c_n))).

Left to PyTorch: an initial state passed in (hx), packed sequences, unbatched input, an LSTM with proj_size, nn.RNN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from farm_agent.tuner.templates.recurrence import RecurrenceKernel, pack
from farm_agent.tuner.templates.regions.base import Anchor, TemplateRegion, dtype_of, shape_of

if TYPE_CHECKING:
    from farm_agent.tuner.templates.matcher import Matcher


class RecurrenceRegion(TemplateRegion):
    """A held nn.GRU or nn.LSTM, layer after layer through templates.recurrence; its one input the sequence."""

    kind = "recurrence"

    def __init__(self, rnn: nn.GRU | nn.LSTM, precision: str) -> None:
        super().__init__((), [], 1, -1)
        self.rnn = rnn
        self.precision = precision
        self.lstm = isinstance(rnn, nn.LSTM)
        self.kernel = RecurrenceKernel(self.lstm, precision)
        self._packed: tuple[Any, list[tuple[torch.Tensor, ...]]] | None = None

    def produce(self, *inputs: torch.Tensor) -> Any:
        return self.rnn(inputs[0])

    def packed(self) -> list[tuple[torch.Tensor, ...]]:
        """Each layer's weights as the kernel reads them, packed again only when a parameter changed."""
        version = tuple((p.data_ptr(), p._version) for p in self.rnn.parameters())
        if self._packed is None or self._packed[0] != version:
            self._packed = (version, [pack(self.rnn, layer) for layer in range(self.rnn.num_layers)])
        return self._packed[1]

    def run_template(self, inputs: Sequence[torch.Tensor], operands: list[torch.Tensor]) -> Any:
        x = inputs[0]
        if x.dim() != 3:
            raise ValueError("unbatched input is not covered")
        rnn, batch_first = self.rnn, self.rnn.batch_first
        finals, cells = [], []
        for layer in self.packed():
            x, c = self.kernel(x, layer, batch_first)  # between layers, eval's dropout is the identity
            hidden = layer[2].shape[1]
            last, first = (x[:, -1], x[:, 0]) if batch_first else (x[-1], x[0])
            finals.append(last[:, :hidden])
            if rnn.bidirectional:
                finals.append(first[:, hidden:])
            if c is not None:
                cells.append(c)
        h_n = torch.stack(finals)
        return (x, (h_n, torch.cat(cells))) if self.lstm else (x, h_n)

    def describe(self) -> str:
        rnn = self.rnn
        return f"{type(rnn).__name__.lower()} {self.precision} layers={rnn.num_layers}" \
            f"{' bidirectional' if rnn.bidirectional else ''}"


def find(matcher: Matcher, node: fx.Node, mod: nn.Module | None) -> Anchor | None:
    if type(mod) not in (nn.GRU, nn.LSTM) or mod.training or node.kwargs or len(node.args) != 1:
        return None
    rnn: nn.GRU | nn.LSTM = mod  # type: ignore[assignment]  # checked above
    x = node.args[0]
    if not isinstance(x, fx.Node) or len(shape_of(x) or ()) != 3 or dtype_of(x) != torch.float32 \
            or getattr(rnn, "proj_size", 0):
        return None
    precision = matcher.precision

    def make(chain: tuple[Any, ...], sources: list[tuple[str, Any]]) -> TemplateRegion:
        return RecurrenceRegion(rnn, precision)

    return Anchor("recurrence", [x], -1, make, chainable=False)
