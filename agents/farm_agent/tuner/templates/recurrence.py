"""GRU and LSTM layers as one persistent kernel a layer: the recurrence never leaves the GPU between time steps.

PyTorch runs a recurrent layer as cuDNN's kernels, and torch.compile's call took as long as eager's: in strict
fp32 the whole-model suite's GRU and LSTM sat at 0.1-0.2 % of the speed of light, eager's under both objectives
(an H100, lease N).

Here a layer is two launches:
1. The input projection of every step and direction at once (x @ W_ih^T + the biases that add to it): one GEMM,
   the GEMM template's under split-TF32, cuBLAS's under ieee.
2. The recurrence: a program owns BLOCK_B rows of the batch in one direction and walks the T steps itself. Each
   step reads the previous step's hidden state back from the output it wrote (the same program wrote it, so a CTA
   barrier orders it), multiplies it by W_hh^T in BLOCK_N column blocks of every gate (tl.dot at the region's
   precision: tf32x3 gives fp32's error on tensor cores), applies the gates in registers and writes h_t (and an
   LSTM's cell state) once. W_hh is re-read every step, from L2 (a GRU of 128 hidden units: 192 KB).

The gates are PyTorch's: GRU r, z, n with n = tanh(x_n + r * (h W_hn + b_hn)) and h' = (1 - z) n + z h; LSTM i, f,
g, o with c' = f c + i g and h' = o tanh(c'). Both directions of a bidirectional layer are one launch (grid axis 1).
The first step multiplies a zero state (the loads are masked): hx is not taken (regions.recurrence).
"""

from __future__ import annotations

from typing import Any

import torch

from farm_agent.tuner.templates import codegen
from farm_agent.tuner.templates.epilogue import Step
from farm_agent.tuner.templates.gemm import PRECISIONS, GemmKernel

_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def _sigmoid(v):
    return 1.0 / (1.0 + tl.exp(-v))


@triton.jit
def _tanh(v):
    return 2.0 / (1.0 + tl.exp(-2.0 * v)) - 1.0


@triton.jit
def kernel(XP, W, BHN, Y, C, B, T, s_xb, s_xt, s_yb, s_yt, H: tl.constexpr, G: tl.constexpr, LSTM: tl.constexpr,
           PRECISION: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # XP [B, T, D, G*H] (strided over B and T): the input projection with its biases. W [D, H, G*H]: W_hh^T.
    # BHN [D, H]: a GRU's b_hn (inside r * ...). Y [B, T, D*H] (strided): the output, and each step's state.
    # C [B, D, H]: an LSTM's cell state. G: the gates (3, or an LSTM's 4).
    d = tl.program_id(1)
    dirs = tl.num_programs(1)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    r_ok = (rows < B)[:, None]
    rows64 = rows.to(tl.int64)[:, None]
    xp_rows = XP + rows64 * s_xb + d * (G * H)
    y_rows = Y + rows64 * s_yb + d * H
    c_rows = C + (rows64 * dirs + d) * H
    w_dir = W + d * (H * G * H)
    ks = tl.arange(0, BLOCK_K)
    ns = tl.arange(0, BLOCK_N)
    for step in range(T):
        t = step + d * (T - 1 - 2 * step)  # forward: step; reverse: T - 1 - step
        prev = (t - 1 + 2 * d).to(tl.int64)  # time-major, t * s_xt passes 2**31 on long batches
        t = t.to(tl.int64)
        has_prev = step > 0
        for n0 in range(0, H, BLOCK_N):
            cols = n0 + ns
            c_ok = (cols < H)[None, :]
            acc0 = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
            acc1 = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
            acc3 = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                kk = k0 + ks
                k_ok = kk < H
                h = tl.load(y_rows + prev * s_yt + kk[None, :], mask=r_ok & k_ok[None, :] & has_prev, other=0.0)
                w = w_dir + kk[:, None] * (G * H) + cols[None, :]
                w_ok = k_ok[:, None] & c_ok
                acc0 = tl.dot(h, tl.load(w, mask=w_ok, other=0.0), acc0, input_precision=PRECISION)
                acc1 = tl.dot(h, tl.load(w + H, mask=w_ok, other=0.0), acc1, input_precision=PRECISION)
                acc2 = tl.dot(h, tl.load(w + 2 * H, mask=w_ok, other=0.0), acc2, input_precision=PRECISION)
                if LSTM:
                    acc3 = tl.dot(h, tl.load(w + 3 * H, mask=w_ok, other=0.0), acc3, input_precision=PRECISION)
            ok = r_ok & c_ok
            xp = xp_rows + t * s_xt + cols[None, :]
            x0 = tl.load(xp, mask=ok, other=0.0)
            x1 = tl.load(xp + H, mask=ok, other=0.0)
            x2 = tl.load(xp + 2 * H, mask=ok, other=0.0)
            if LSTM:
                x3 = tl.load(xp + 3 * H, mask=ok, other=0.0)
                c_prev = tl.load(c_rows + cols[None, :], mask=ok & has_prev, other=0.0)
                c = _sigmoid(x1 + acc1) * c_prev + _sigmoid(x0 + acc0) * _tanh(x2 + acc2)
                tl.store(c_rows + cols[None, :], c, mask=ok)
                h_new = _sigmoid(x3 + acc3) * _tanh(c)
            else:
                b_hn = tl.load(BHN + d * H + cols, mask=cols < H, other=0.0)
                r = _sigmoid(x0 + acc0)
                z = _sigmoid(x1 + acc1)
                n = _tanh(x2 + r * (acc2 + b_hn[None, :]))
                h_prev = tl.load(y_rows + prev * s_yt + cols[None, :], mask=ok & has_prev, other=0.0)
                h_new = (1.0 - z) * n + z * h_prev
            tl.store(y_rows + t * s_yt + cols[None, :], h_new, mask=ok)
        tl.debug_barrier()  # this step's state, written by every warp, is what the next step's products read
'''


def configs(batch: int, hidden: int) -> list[Any]:
    """Rows a program by column block by reduction block: the tiles lease P measured (H100,
    benchmarks/kernels/recurrence_tiles.py), where 16 rows a program ran a layer 2 to 3 times faster than 32 or 64
    on its suite's layers (the wider tiles stay in the search for larger batches, not measured); no wider than the
    batch or hidden size needs."""
    import triton

    caps = (max(16, triton.next_power_of_2(batch)), max(16, triton.next_power_of_2(hidden)))
    seen: set[tuple[int, ...]] = set()
    found = []
    for bb, bn, bk, warps, stages in ((16, 64, 32, 4, 2), (32, 64, 32, 4, 2), (16, 128, 32, 8, 1),
                                      (64, 64, 32, 8, 2)):
        key = (min(bb, caps[0]), min(bn, caps[1]), min(bk, caps[1]), warps, stages)
        if key not in seen:
            seen.add(key)
            found.append(triton.Config({"BLOCK_B": key[0], "BLOCK_N": key[1], "BLOCK_K": key[2]},
                                       num_warps=warps, num_stages=stages))
    return found


class RecurrenceKernel:
    """One layer of a GRU or an LSTM (both directions of a bidirectional one), its weights packed by `pack`."""

    def __init__(self, lstm: bool, precision: str) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        self.lstm, self.precision = lstm, precision
        self.projection = GemmKernel((Step("add", "channel"),), precision) if precision != "ieee" else None
        self._kernel: Any = None

    def __call__(self, x: torch.Tensor, packed: tuple[torch.Tensor, ...], batch_first: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(output [B, T, D*H] or [T, B, D*H], the LSTM's final cell state [D, B, H] or None). `packed`: this
        layer's weights from `pack`."""
        w_ih_t, bias, w_hh_t, b_hn = packed
        dirs, hidden = w_hh_t.shape[0], w_hh_t.shape[1]
        lead = x.shape[:2]
        flat = x.reshape(-1, x.shape[-1])
        xp = self.projection(flat, w_ih_t, [bias]) if self.projection is not None else \
            torch.addmm(bias, flat, w_ih_t)
        xp = xp.view(*lead, -1)
        batch, steps = (lead[0], lead[1]) if batch_first else (lead[1], lead[0])
        y = torch.empty((*lead, dirs * hidden), device=x.device, dtype=torch.float32)
        c = torch.empty((batch, dirs, hidden), device=x.device, dtype=torch.float32) if self.lstm else y
        s_xb, s_xt = (xp.stride(0), xp.stride(1)) if batch_first else (xp.stride(1), xp.stride(0))
        s_yb, s_yt = (y.stride(0), y.stride(1)) if batch_first else (y.stride(1), y.stride(0))
        if self._kernel is None:
            module = codegen.load_source(_SOURCE, "recurrence")
            self._kernel = codegen.autotuned(module.kernel, configs(batch, hidden), ["B", "T", "H"])
        self._kernel[lambda meta: (-(-batch // meta["BLOCK_B"]), dirs)](
            xp, w_hh_t, b_hn, y, c, batch, steps, s_xb, s_xt, s_yb, s_yt, H=hidden, G=4 if self.lstm else 3,
            LSTM=self.lstm, PRECISION=self.precision)
        return y, (c.transpose(0, 1) if self.lstm else None)


def pack(rnn: torch.nn.GRU | torch.nn.LSTM, layer: int) -> tuple[torch.Tensor, ...]:
    """A layer's weights as the kernel reads them, both directions side by side: W_ih^T [F, D*G*H]; the biases
    added to the projection [D*G*H] (all of an LSTM's; a GRU's but b_hn, which r multiplies); W_hh^T [D, H, G*H];
    a GRU's b_hn [D, H] (zeros for an LSTM, which does not read it)."""
    hidden, gates = rnn.hidden_size, 4 if isinstance(rnn, torch.nn.LSTM) else 3
    suffixes = ["", "_reverse"] if rnn.bidirectional else [""]
    w_ih, biases, w_hh, b_hn = [], [], [], []
    for suffix in suffixes:
        w_ih.append(getattr(rnn, f"weight_ih_l{layer}{suffix}").detach())
        w_hh.append(getattr(rnn, f"weight_hh_l{layer}{suffix}").detach().t())
        weight = w_ih[-1]
        if rnn.bias:
            b_ih = getattr(rnn, f"bias_ih_l{layer}{suffix}").detach()
            b_hh = getattr(rnn, f"bias_hh_l{layer}{suffix}").detach()
        else:
            b_ih = b_hh = weight.new_zeros(gates * hidden)
        if gates == 3:
            biases.append(b_ih + torch.cat([b_hh[:2 * hidden], b_hh.new_zeros(hidden)]))
            b_hn.append(b_hh[2 * hidden:])
        else:
            biases.append(b_ih + b_hh)
            b_hn.append(b_hh.new_zeros(hidden))
    return (torch.cat(w_ih).t().contiguous(), torch.cat(biases).contiguous(), torch.stack(w_hh).contiguous(),
            torch.stack(b_hn).contiguous())


def torch_layer(x: torch.Tensor, packed: tuple[torch.Tensor, ...], lstm: bool, batch_first: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What the kernel computes for one layer, step by step in PyTorch from the packed weights: its arithmetic, for
    the tests on a CPU (a region runs the module itself where Triton does not)."""
    w_ih_t, bias, w_hh_t, b_hn = packed
    dirs, hidden = w_hh_t.shape[0], w_hh_t.shape[1]
    seq = x if batch_first else x.transpose(0, 1)
    xp = (seq @ w_ih_t + bias).view(seq.shape[0], seq.shape[1], dirs, -1)
    steps = seq.shape[1]
    out = seq.new_empty(seq.shape[0], steps, dirs * hidden)
    cells = []
    for d in range(dirs):
        h = seq.new_zeros(seq.shape[0], hidden)
        c = torch.zeros_like(h)
        for t in (range(steps) if d == 0 else reversed(range(steps))):
            g = (h @ w_hh_t[d]).split(hidden, dim=1)
            x4 = xp[:, t, d].split(hidden, dim=1)
            if lstm:
                c = torch.sigmoid(x4[1] + g[1]) * c + torch.sigmoid(x4[0] + g[0]) * torch.tanh(x4[2] + g[2])
                h = torch.sigmoid(x4[3] + g[3]) * torch.tanh(c)
            else:
                r, z = torch.sigmoid(x4[0] + g[0]), torch.sigmoid(x4[1] + g[1])
                h = (1 - z) * torch.tanh(x4[2] + r * (g[2] + b_hn[d])) + z * h
            out[:, t, d * hidden:(d + 1) * hidden] = h
        cells.append(c)
    return (out if batch_first else out.transpose(0, 1)), (torch.stack(cells) if lstm else None)
