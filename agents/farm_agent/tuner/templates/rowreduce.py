"""One-pass row reductions: softmax, log-softmax, logsumexp, LayerNorm, RMSNorm, GroupNorm, sum, mean, amax, the
per-row loss of a cross-entropy (logsumexp minus the target's logit: one read of the row), and torch.var_mean (two
outputs from one read: the variance at Y, the mean at Y2).

The input is viewed as rows of length L (the reduced dims, contiguous): a LayerNorm's or softmax's last dim, a
GroupNorm's (channels of a group x spatial), a global average pool's spatial dims. A prologue (templates.prologue: a
scale, a causal mask ...) is applied to each element as it is loaded, a causal mask computed from the indices. Rows
that fit a block are read once and written once, ROWS of them per program; longer rows take two reads (statistics,
then the result): the online softmax (running max, rescaled sum) and a shifted sum of squares for the norms. The
affine of a norm and the epilogue chain run before the store; `chan` is the feature (layer/RMS norm, softmax), the
channel (group norm) or the row's channel (row outputs: logsumexp, sum, mean, amax).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from farm_agent.tuner.templates import codegen
from farm_agent.tuner.templates.epilogue import Step, triton_lines
from farm_agent.tuner.templates.prologue import Prologue, check, fill_of
from farm_agent.tuner.templates.prologue import triton_lines as prologue_lines

OPS = ("softmax", "log_softmax", "logsumexp", "layer_norm", "rms_norm", "group_norm", "sum", "mean", "amax",
       "cross_entropy", "normalize", "var_mean")
ROW_OUTPUT = ("logsumexp", "sum", "mean", "amax", "cross_entropy", "var_mean")
LSE_OPS = ("softmax", "log_softmax", "logsumexp", "cross_entropy")
MAX_ONE_PASS = 16384


@dataclass(frozen=True)
class RowSpec:
    """op over the trailing `reduced` dims of the input (group_norm: the channels and spatial dims, in `groups`)."""

    op: str
    reduced: int = 1  # how many trailing dims form a row
    eps: float = 1e-5
    groups: int = 1  # group_norm only
    keepdim: bool = False  # row outputs: keep the reduced dims as size 1
    ignore_index: int = -100  # cross_entropy only: rows with this target count 0
    correction: int = 1  # var_mean only: the variance divides by L - correction (1: Bessel's, PyTorch's default)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown row op {self.op!r}")
        if self.reduced < 1:
            raise ValueError("a row spans at least one dim")
        if self.op == "cross_entropy" and self.reduced != 1:
            raise ValueError("cross_entropy's rows are the class dim")

    def rows(self, shape: Sequence[int]) -> tuple[int, int]:
        """(rows, row length) of an input shape."""
        if self.op == "group_norm":
            n, c = shape[0], shape[1]
            if c % self.groups:
                raise ValueError(f"{c} channels do not split into {self.groups} groups")
            spatial = 1
            for s in shape[2:]:
                spatial *= s
            return n * self.groups, (c // self.groups) * spatial
        length = 1
        for s in shape[len(shape) - self.reduced:]:
            length *= s
        total = 1
        for s in shape:
            total *= s
        return total // max(length, 1), length

    def output_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        if self.op not in ROW_OUTPUT:
            return tuple(shape)
        lead = tuple(shape[:len(shape) - self.reduced])
        return (*lead, *([1] * self.reduced)) if self.keepdim else lead


def torch_rows(x: torch.Tensor, spec: RowSpec, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, targets: torch.Tensor | None = None) -> torch.Tensor:
    """The op in PyTorch (weight/bias: the norm's affine; targets: cross_entropy's class per row)."""
    dims = tuple(range(x.dim() - spec.reduced, x.dim()))
    if spec.op == "cross_entropy":  # per row, as the kernel writes it (the region reduces it)
        assert targets is not None
        return F.cross_entropy(x, targets, ignore_index=spec.ignore_index, reduction="none")
    if spec.op == "softmax":
        return torch.softmax(x, dim=-1)
    if spec.op == "log_softmax":
        return torch.log_softmax(x, dim=-1)
    if spec.op == "logsumexp":
        return torch.logsumexp(x, dim=dims, keepdim=spec.keepdim)
    if spec.op == "layer_norm":
        return F.layer_norm(x, x.shape[-spec.reduced:], weight, bias, spec.eps)
    if spec.op == "rms_norm":
        return F.rms_norm(x, x.shape[-spec.reduced:], weight, spec.eps)
    if spec.op == "group_norm":
        return F.group_norm(x, spec.groups, weight, bias, spec.eps)
    if spec.op == "normalize":
        return F.normalize(x, p=2.0, dim=-1, eps=spec.eps)
    if spec.op == "var_mean":  # a tuple: (variance, mean)
        return torch.var_mean(x, dim=dims, correction=spec.correction, keepdim=spec.keepdim)  # type: ignore[return-value]
    if spec.op == "sum":
        return x.sum(dim=dims, keepdim=spec.keepdim)
    if spec.op == "mean":
        return x.mean(dim=dims, keepdim=spec.keepdim)
    return x.amax(dim=dims, keepdim=spec.keepdim)


_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def load_tile(X, rows, r_ok, c, L, Q, DIAG, {pro_params}other, HAS_PRO: tl.constexpr, MASK: tl.constexpr,
              EVICT: tl.constexpr):
    # the rows' elements at columns c as fp32, after the prologue; `other` past the row's end. MASK (a causal
    # fill): 1 keeps the columns before q + DIAG, 2 those after it, q the row's index in its [Q, L] matrix. The
    # filled elements are read all the same: the evaluator takes a time under (every input and output byte) /
    # bandwidth for skipped work, and a causal softmax that skips them would be faster than that
    inside = r_ok[:, None] & (c[None, :] < L)
    offs = rows.to(tl.int64)[:, None] * L + c[None, :]
    if HAS_PRO:
        mask = inside
        if MASK == 1:
            keep = c[None, :] < (rows % Q + DIAG)[:, None]
        elif MASK == 2:
            keep = c[None, :] > (rows % Q + DIAG)[:, None]
        else:
            keep = inside
        acc = tl.load(X + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
{prologue}
        acc = tl.where(inside, acc, other)
    else:
        acc = tl.load(X + offs, mask=inside, other=other, eviction_policy=EVICT).to(tl.float32)
    return acc


@triton.jit
def kernel(X, Y, Y2, Wt, Bs, T, {epi_params}{pro_params}R, L, CHANNELS, G, S, eps, CORR, IGNORE, Q, DIAG,
           OP: tl.constexpr, LSE: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ONE_PASS: tl.constexpr,
           ROW_OUT: tl.constexpr, HAS_PRO: tl.constexpr, MASK: tl.constexpr, ROWS: tl.constexpr,
           BLOCK: tl.constexpr, PERSIST: tl.constexpr):
    # PERSIST (rows read twice): as many programs as SMs, each finishing its rows one block after the other, so
    # that the rows read by the first pass are few enough to be in L2 still when the second pass reads them
    if PERSIST:
        for pid in range(tl.program_id(0), tl.cdiv(R, ROWS), tl.num_programs(0)):
            row_block(pid, X, Y, Y2, Wt, Bs, T, {epi_params}{pro_params}R, L, CHANNELS, G, S, eps, CORR, IGNORE, Q,
                      DIAG, OP, LSE, HAS_W, HAS_B, ONE_PASS, ROW_OUT, HAS_PRO, MASK, ROWS, BLOCK, "evict_last",
                      "evict_first")
    else:
        row_block(tl.program_id(0), X, Y, Y2, Wt, Bs, T, {epi_params}{pro_params}R, L, CHANNELS, G, S, eps, CORR,
                  IGNORE, Q, DIAG, OP, LSE, HAS_W, HAS_B, ONE_PASS, ROW_OUT, HAS_PRO, MASK, ROWS, BLOCK, "", "")


@triton.jit
def row_block(pid, X, Y, Y2, Wt, Bs, T, {epi_params}{pro_params}R, L, CHANNELS, G, S, eps, CORR, IGNORE, Q, DIAG,
              OP: tl.constexpr, LSE: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
              ONE_PASS: tl.constexpr, ROW_OUT: tl.constexpr, HAS_PRO: tl.constexpr, MASK: tl.constexpr,
              ROWS: tl.constexpr, BLOCK: tl.constexpr, EVICT1: tl.constexpr, EVICT2: tl.constexpr):
    # EVICT1, EVICT2: the first and second reads' eviction policies (two-pass rows)
    # OP: 0 softmax, 1 log_softmax, 2 logsumexp, 3 layer_norm, 4 rms_norm, 5 group_norm, 6 sum, 7 mean, 8 amax,
    # 9 cross_entropy (per row: logsumexp minus the logit at the row's target T, 0 where the target is IGNORE),
    # 10 normalize (x / max(|x|, eps), F.normalize's p = 2), 11 var_mean (the variance over L - CORR at Y, the
    # mean at Y2);
    # LSE: the row's max and sum of exponentials are its statistics (0, 1, 2 and 9)
    rows = pid * ROWS + tl.arange(0, ROWS)
    r_ok = rows < R
    cols = tl.arange(0, BLOCK)
    y_rows = Y + rows.to(tl.int64)[:, None] * L
    if ONE_PASS:
        m2 = r_ok[:, None] & (cols[None, :] < L)
        x = load_tile(X, rows, r_ok, cols, L, Q, DIAG, {pro_args}0.0, HAS_PRO, MASK, "")
        if LSE:
            xm = tl.where(m2, x, float("-inf"))
            mx = tl.max(xm, axis=1)
            mx = tl.where(mx == float("-inf"), 0.0, mx)
            e = tl.where(m2, tl.exp(xm - mx[:, None]), 0.0)
            s = tl.sum(e, axis=1)
            if OP == 0:
                full = e / s[:, None]
            elif OP == 1:
                full = x - mx[:, None] - tl.log(s)[:, None]
            else:
                row = mx + tl.log(s)
        elif OP <= 5 or OP == 10:
            if OP == 4:
                inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / L + eps)
                full = x * inv[:, None]
            elif OP == 10:
                inv = 1.0 / tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), eps)
                full = x * inv[:, None]
            else:
                mean = tl.sum(x, axis=1) / L
                xc = tl.where(m2, x - mean[:, None], 0.0)
                inv = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / L + eps)
                full = xc * inv[:, None]
        elif OP == 6:
            row = tl.sum(x, axis=1)
        elif OP == 7:
            row = tl.sum(x, axis=1) / L
        elif OP == 11:
            mean = tl.sum(x, axis=1) / L
            xc = tl.where(m2, x - mean[:, None], 0.0)
            row = tl.sum(xc * xc, axis=1) / (L - CORR)
        else:
            row = tl.max(tl.where(m2, x, float("-inf")), axis=1)
    else:
        # pass 1: statistics per lane, combined per row
        if LSE:
            run_max = tl.full((ROWS, BLOCK), float("-inf"), dtype=tl.float32)
            run_sum = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
        elif OP == 4 or (OP >= 6 and OP != 11):
            shift = tl.zeros((ROWS,), dtype=tl.float32)
        elif HAS_PRO:  # the mean of the row's first block after the prologue (near the row's mean, usually)
            first = load_tile(X, rows, r_ok, cols, L, Q, DIAG, {pro_args}0.0, HAS_PRO, MASK, EVICT1)
            shift = tl.sum(first, axis=1) / tl.minimum(L, BLOCK)
        else:
            shift = tl.load(X + rows.to(tl.int64) * L, mask=r_ok, other=0.0).to(tl.float32)
        if not LSE:
            acc1 = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
            acc2 = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
            accm = tl.full((ROWS, BLOCK), float("-inf"), dtype=tl.float32)
        for start in range(0, L, BLOCK):
            m2 = r_ok[:, None] & ((start + cols)[None, :] < L)
            if LSE:
                x = load_tile(X, rows, r_ok, start + cols, L, Q, DIAG, {pro_args}float("-inf"), HAS_PRO, MASK,
                              EVICT1)
                new_max = tl.maximum(run_max, x)
                scale = tl.where(new_max == float("-inf"), 0.0, tl.exp(run_max - new_max))
                run_sum = run_sum * scale + tl.where(x == float("-inf"), 0.0, tl.exp(x - new_max))
                run_max = new_max
            else:
                x = load_tile(X, rows, r_ok, start + cols, L, Q, DIAG, {pro_args}0.0, HAS_PRO, MASK, EVICT1)
                d = tl.where(m2, x - shift[:, None], 0.0)
                acc1 += d
                acc2 += d * d
                accm = tl.maximum(accm, tl.where(m2, x, float("-inf")))
        if LSE:
            mx = tl.max(run_max, axis=1)
            mx = tl.where(mx == float("-inf"), 0.0, mx)
            s = tl.sum(run_sum * tl.where(run_max == float("-inf"), 0.0, tl.exp(run_max - mx[:, None])), axis=1)
            row = mx + tl.log(s)
        else:
            s1 = tl.sum(acc1, axis=1) / L
            s2 = tl.sum(acc2, axis=1) / L
            if OP == 4:
                inv = 1.0 / tl.sqrt(s2 + eps)
                mean = shift
            elif OP == 10:
                inv = 1.0 / tl.maximum(tl.sqrt(s2 * L), eps)
                mean = shift
            else:
                mean = shift + s1
                inv = 1.0 / tl.sqrt(tl.maximum(s2 - s1 * s1, 0.0) + eps)
            if OP == 6:
                row = s1 * L
            elif OP == 7:
                row = s1
            elif OP == 8:
                row = tl.max(accm, axis=1)
            elif OP == 11:
                row = tl.maximum(s2 - s1 * s1, 0.0) * L / (L - CORR)
    if ROW_OUT:
        if OP == 9:
            t = tl.load(T + rows, mask=r_ok, other=IGNORE)
            hit = r_ok & (t != IGNORE) & (t >= 0) & (t < L)
            row = tl.where(hit, row - tl.load(X + rows.to(tl.int64) * L + t, mask=hit, other=0.0).to(tl.float32), 0.0)
        acc = row
        offs = rows
        chan = rows % CHANNELS
        mask = r_ok
{epilogue_row}
        tl.store(Y + offs, acc, mask=mask)
        if OP == 11:
            tl.store(Y2 + offs, mean, mask=mask)
    elif ONE_PASS:
        acc = full
        mask = r_ok[:, None] & (cols[None, :] < L)
        offs = rows.to(tl.int64)[:, None] * L + cols[None, :]
        if OP == 5:
            chan = (rows % G)[:, None] * (L // S) + cols[None, :] // S
        else:
            chan = cols[None, :] + rows[:, None] * 0
        if HAS_W:
            acc = acc * tl.load(Wt + chan, mask=mask, other=1.0)
        if HAS_B:
            acc = acc + tl.load(Bs + chan, mask=mask, other=0.0)
{epilogue_full}
        tl.store(Y + offs, acc, mask=mask)
    else:
        for start in range(0, L, BLOCK):
            mask = r_ok[:, None] & ((start + cols)[None, :] < L)
            x = load_tile(X, rows, r_ok, start + cols, L, Q, DIAG, {pro_args}0.0, HAS_PRO, MASK, EVICT2)
            if OP == 0:
                acc = tl.exp(x - row[:, None])
            elif OP == 1:
                acc = x - row[:, None]
            else:
                acc = (x - mean[:, None]) * inv[:, None]
            offs = rows.to(tl.int64)[:, None] * L + start + cols[None, :]
            if OP == 5:
                chan = (rows % G)[:, None] * (L // S) + (start + cols)[None, :] // S
            else:
                chan = (start + cols)[None, :] + rows[:, None] * 0
            if HAS_W:
                acc = acc * tl.load(Wt + chan, mask=mask, other=1.0)
            if HAS_B:
                acc = acc + tl.load(Bs + chan, mask=mask, other=0.0)
{epilogue_loop}
            tl.store(Y + offs, acc, mask=mask)
'''

OP_CODE = {op: i for i, op in enumerate(OPS)}


def plan(length: int) -> list[tuple[int, int, int]]:
    """(ROWS, BLOCK, num_warps) choices for a row length: the autotuning space. Short rows pack several rows per
    program so that each program still moves a few KiB; a long row gets one program and a choice of warps."""
    if length <= MAX_ONE_PASS:
        block = 1 << max(0, length - 1).bit_length()  # the next power of two
        choices = []
        for rows in (1, 2, 4, 8, 16):
            tile = rows * block
            if tile > 16384 or (rows > 1 and tile > 8192) or (rows > 1 and block >= 4096):
                continue
            warps = 4 if tile <= 2048 else 8 if tile <= 8192 else 16
            choices.append((rows, block, warps))
        choices = choices[-3:]
        if len(choices) == 1:  # one long row per program (4096 and up): how many warps share it is the choice
            rows, block, warps = choices[0]
            choices += [(rows, block, w) for w in (warps // 2, warps * 2) if 4 <= w <= 16 and block // (32 * w) >= 4]
        return choices
    return [(1, 4096, 8), (1, 2048, 4), (1, 8192, 16)]


def configs(length: int) -> list[tuple[int, int, int, bool]]:
    """(ROWS, BLOCK, num_warps, PERSIST): plan's tiles, and for rows read twice the same tiles on a persistent grid
    (one program an SM: the rows in flight are few enough that the second read finds them in L2). The autotuner
    times both: the persistent grid is a choice, never forced."""
    tiles = plan(length)
    return [(r, b, w, False) for r, b, w in tiles] + \
        ([(r, b, w, True) for r, b, w in tiles] if length > MAX_ONE_PASS else [])


class RowKernel:
    def __init__(self, spec: RowSpec, chain: tuple[Step, ...], prologue: Prologue = ()) -> None:
        check(prologue)
        if prologue and spec.op == "cross_entropy":
            raise ValueError("cross_entropy's logits take no prologue")
        if fill_of(prologue) is not None and (spec.reduced != 1 or spec.op == "group_norm"):
            raise ValueError("a causal fill needs rows along the last dim")
        self.spec, self.chain, self.prologue = spec, chain, prologue
        self._kernels: dict[bool, Any] = {}

    def source(self) -> str:
        params, _ = triton_lines(self.chain)
        pro_params, pro_lines = prologue_lines(self.prologue, " " * 8)
        return _SOURCE.format(
            epi_params="".join(f"{p}, " for p in params), pro_params="".join(f"{p}, " for p in pro_params),
            pro_args="".join(f"{p}, " for p in pro_params), prologue="\n".join(pro_lines),
            epilogue_row="\n".join(triton_lines(self.chain, " " * 8)[1]),
            epilogue_full="\n".join(triton_lines(self.chain, " " * 8)[1]),
            epilogue_loop="\n".join(triton_lines(self.chain, " " * 12)[1]))

    def _kernel(self, one_pass: bool, length: int) -> Any:
        import triton

        if one_pass not in self._kernels:
            module = codegen.load_source(self.source(), "rows")
            tiles = [triton.Config({"ROWS": r, "BLOCK": b, "PERSIST": p}, num_warps=w)
                     for r, b, w, p in configs(length)]
            self._kernels[one_pass] = codegen.autotuned(module.kernel, tiles, ["R", "L"])
        return self._kernels[one_pass]

    def __call__(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                 operands: Sequence[torch.Tensor], channels: int = 1, targets: torch.Tensor | None = None,
                 pro_operands: Sequence[torch.Tensor] = ()) -> Any:
        """pro_operands: the prologue's tensors, of x's shape. A tensor; for var_mean, (variance, mean)."""
        import triton

        spec = self.spec
        x = x.contiguous()
        r, length = spec.rows(x.shape)
        y = torch.empty(spec.output_shape(x.shape), device=x.device, dtype=torch.float32)
        y2 = torch.empty_like(y) if spec.op == "var_mean" else y
        one_pass = length <= MAX_ONE_PASS
        spatial = 1
        if spec.op == "group_norm":
            for s in x.shape[2:]:
                spatial *= s
        kernel = self._kernel(one_pass, length)
        fill = fill_of(self.prologue)
        if fill is not None and x.dim() < 2:
            raise ValueError("a causal fill needs a [..., Q, K] input")
        programs = _sm_count(x.device)
        kernel[lambda meta: (min(triton.cdiv(r, meta["ROWS"]), programs) if meta["PERSIST"] else
                             triton.cdiv(r, meta["ROWS"]),)](
            x, y, y2, weight if weight is not None else x, bias if bias is not None else x,
            targets.contiguous() if targets is not None else x, *operands,
            *(t.float().expand(x.shape).contiguous() for t in pro_operands), r, length, channels, spec.groups,
            spatial, spec.eps, spec.correction, spec.ignore_index, x.shape[-2] if fill is not None else 1,
            fill.diagonal if fill is not None else 0, OP=OP_CODE[spec.op], LSE=spec.op in LSE_OPS,
            HAS_W=weight is not None, HAS_B=bias is not None, ONE_PASS=one_pass, ROW_OUT=spec.op in ROW_OUTPUT,
            HAS_PRO=bool(self.prologue), MASK=fill.code if fill is not None else 0)
        return (y, y2) if spec.op == "var_mean" else y


@functools.cache  # read once a device: a template's launch is on the timed path
def _sm_count(device: torch.device) -> int:
    """The persistent grid's size: the GPU's SMs (under the CPU interpreter, a few, so that programs loop)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 3
