"""The recurrence template's tiles on a GPU, one layer at a time: each config of templates.recurrence forced, at
each precision, against cuDNN's layer in strict fp32 and in TF32, on the whole-model suite's GRU and LSTM layers.

    python benchmarks/kernels/recurrence_tiles.py

Prints a table: the layer, the candidate, ms a call (triton.testing.do_bench, calls back to back), and the largest
error against the same layer in fp64 on the GPU. What the autotuner picks among the tiles is by time; this shows
the spread, and what a step costs (ms / steps).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]

from farm_agent.tuner.templates import codegen, recurrence  # noqa: E402

LAYERS = {  # (module, batch, steps): the first layer of benchmarks/kernels/models' GRU and LSTM
    "gru_bidirectional l0": (lambda: nn.GRU(64, 128, batch_first=True, bidirectional=True), 256, 64),
    "gru_bidirectional l1": (lambda: nn.GRU(256, 128, batch_first=True, bidirectional=True), 256, 64),
    "lstm_classifier": (lambda: nn.LSTM(32, 256, batch_first=True), 512, 128),
}


def main() -> None:
    import triton
    import triton.testing

    torch.manual_seed(0)
    print(f"{'layer':24} {'candidate':34} {'ms':>8} {'us/step':>8} {'max |err|':>10}")
    for name, (make, batch, steps) in LAYERS.items():
        rnn = make().cuda().eval()
        x = torch.randn(batch, steps, rnn.input_size, device="cuda")
        lstm = isinstance(rnn, nn.LSTM)
        with torch.no_grad():
            exact = make().double().cuda()
            exact.load_state_dict(rnn.state_dict())
            want = exact(x.double())[0]
            rows = []
            for tf32 in (False, True):
                torch.backends.cudnn.allow_tf32 = tf32
                ms = triton.testing.do_bench(lambda r=rnn, a=x: r(a), warmup=10, rep=100)
                rows.append((f"cudnn {'tf32' if tf32 else 'fp32'}", ms, (rnn(x)[0] - want).abs().max().item()))
            torch.backends.cudnn.allow_tf32 = False
            packed = recurrence.pack(rnn, 0)
            module = codegen.load_source(recurrence._SOURCE, "recurrence")
            for precision in ("ieee", "tf32x3"):
                for config in recurrence.configs(batch, rnn.hidden_size):
                    kernel = recurrence.RecurrenceKernel(lstm, precision)
                    kernel._kernel = codegen.Launcher(codegen._Fixed(module.kernel, config), module.kernel, [])
                    ms = triton.testing.do_bench(lambda k=kernel, a=x, p=packed: k(a, p, True), warmup=10, rep=100)
                    got = kernel(x, packed, True)[0]
                    tile = "x".join(str(v) for v in config.kwargs.values())
                    rows.append((f"template {precision} {tile} w{config.num_warps} s{config.num_stages}", ms,
                                 (got.double() - want).abs().max().item()))
        for candidate, ms, err in rows:
            print(f"{name:24} {candidate:34} {ms:8.3f} {1000 * ms / steps:8.2f} {err:10.2e}", flush=True)


if __name__ == "__main__":
    main()
