"""A decode GEMV on tensor cores, the weight as the MMA's wide operand (a probe kernel).

The engine's one-row skinny kernel multiplies in float32 on the CUDA cores: every weight
element is converted and fused-multiply-added by an instruction of its own. At batch 1
on an H200 that chain of GEMVs draws ~640 W where a copy moving the same HBM bytes draws
~510 W (``power_probe_gpu.md``), and a Qwen3-8B decode reaches the 700 W cap. Here each
program multiplies a [BLOCK_R, BLOCK_K] tile of the weight by x's [BLOCK_K, 16] (its
<= 16 rows, the rest zero) with ``tl.dot``: one MMA instruction takes a whole block of
weight elements in bfloat16 and the SMs have far less to issue per byte. The sums are
float32, in the tensor cores' order (not the skinny kernel's bits). ``MmaConfig.peel``
loads the first weight tile before a dependent launch's wait; at one row a gated x is
activated on its one row, not on the 16 padded columns (the first measurement had
neither: ``power_probe_gpu_v17.md``). ``MmaConfig.split_k`` cuts K into that many
programs a row block, so a 4096-row weight still fills the GPU with 64-row tiles: each
stores its float32 partial sums, and the block's last program to arrive adds them in
split order (the same bits run to run) and stores the output.

    gemv_mma(x [M, K], weight [N, K], out [M, N], config=MmaConfig(...), gated=False)

``gated``: x holds gate then up (K each) and the product is with silu(gate) * up,
rounded as ``kernels.activation.silu_and_mul`` rounds it. K must be a multiple of
BLOCK_K x split_k. Runs on the CPU under ``TRITON_INTERPRET=1`` (small shapes, for tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._arrivals import arrival_counters
from jacana_engine.kernels._pdl import pdl_launch
from jacana_engine.kernels.activation import silu_mul_rounded

X_COLUMNS = 16  # x's rows as the MMA's narrow operand: tl.dot needs at least 16
COUNTERS = "gemv_mma"  # the split-K blocks' arrival counters (kernels/_arrivals.py)


@dataclass(frozen=True)
class MmaConfig:
    """Rows of the weight a program, K a step, warps, pipeline stages, dependent launch,
    and whether the first weight tile is loaded before the dependent launch's wait (as
    the skinny kernel's ``prefetch_tiles``), so it streams while the kernel before runs."""

    block_r: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4
    pdl: bool = False
    peel: bool = False
    split_k: int = 1  # programs a row block, each a 1/split_k share of K

    def label(self) -> str:
        return (
            f"{self.block_r}x{self.block_k} w{self.num_warps} s{self.num_stages}"
            + (f" k/{self.split_k}" if self.split_k > 1 else "")
            + (" pdl" if self.pdl else "")
            + (" peel" if self.peel else "")
        )


@triton.jit
def _x_tile(x_cols, x_row, k, c_mask, K, GATED: tl.constexpr, ONE_ROW: tl.constexpr, dtype):
    """x's [BLOCK_K, 16] tile at columns ``k``, transposed (its rows as columns, the
    padding zero), activated where GATED. With ONE_ROW the activation runs on the one real
    row ([BLOCK_K]) and is placed in column 0, not on 16 columns of padding."""
    if GATED and ONE_ROW:
        gate = tl.load(x_row + k).to(tl.float32)
        up = tl.load(x_row + K + k).to(tl.float32)
        act = silu_mul_rounded(gate, up, dtype)  # [BLOCK_K]
        first = (tl.arange(0, 16) == 0)[None, :]
        return tl.where(first, act[:, None], tl.zeros([1, 16], dtype))
    if GATED:
        gate = tl.load(x_cols + k[:, None], mask=c_mask[None, :], other=0.0)
        up = tl.load(x_cols + K + k[:, None], mask=c_mask[None, :], other=0.0)
        return silu_mul_rounded(gate.to(tl.float32), up.to(tl.float32), dtype)
    return tl.load(x_cols + k[:, None], mask=c_mask[None, :], other=0.0)


@triton.jit
def _mma(acc, w, xt, UPCAST: tl.constexpr):
    """acc [BLOCK_R, 16] += w [BLOCK_R, BLOCK_K] @ xt [BLOCK_K, 16] in float32."""
    if UPCAST:
        return tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w, xt, acc, out_dtype=tl.float32)


@triton.jit
def _gemv_mma_kernel(
    x_ptr, w_ptr, out_ptr, partial_ptr, counter_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr, PDL: tl.constexpr,
    PEEL: tl.constexpr,  # the first weight tile loaded before the PDL wait
    ONE_ROW: tl.constexpr,  # M == 1: a gated x activates one row, not 16 columns
    SPLIT_K: tl.constexpr,  # programs a row block (program_id(1): which share of K)
    UPCAST: tl.constexpr,  # multiply in float32: the interpreter's tl.dot misreads bfloat16
):  # fmt: skip
    block = tl.program_id(0)
    rows = block * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R] of the weight
    cols = tl.arange(0, 16)  # [16] x's rows, past M zero
    ks = tl.arange(0, BLOCK_K)
    r_mask = rows < N
    c_mask = cols < M
    share = K // SPLIT_K
    k_start = tl.program_id(1) * share
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn  # [BLOCK_R, 1]
    x_cols = x_ptr + cols.to(tl.int64)[None, :] * stride_xm  # [1, 16]
    dtype = x_ptr.dtype.element_ty
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if PEEL:  # weights are never written by other kernels: no need to wait for them
        w_first = tl.load(w_rows + (k_start + ks)[None, :], mask=r_mask[:, None], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BLOCK_R, 16], dtype=tl.float32)
    start = k_start
    if PEEL:
        xt = _x_tile(x_cols, x_ptr, k_start + ks, c_mask, K, GATED, ONE_ROW, dtype)
        acc = _mma(acc, w_first, xt, UPCAST)
        start = k_start + BLOCK_K
    for k0 in range(start, k_start + share, BLOCK_K):
        k = k0 + ks
        w = tl.load(w_rows + k[None, :], mask=r_mask[:, None], other=0.0)  # [BLOCK_R, BLOCK_K]
        xt = _x_tile(x_cols, x_ptr, k, c_mask, K, GATED, ONE_ROW, dtype)  # [BLOCK_K, 16]
        acc = _mma(acc, w, xt, UPCAST)
    done = r_mask[:, None] & c_mask[None, :]
    # out[m, r] and the partials [SPLIT_K, 16, N] [s, m, r]: x's rows are the MMA's columns
    at = cols.to(tl.int64)[None, :] * N + rows[:, None]  # [BLOCK_R, 16]
    if SPLIT_K > 1:
        tl.store(partial_ptr + tl.program_id(1) * 16 * N + at, acc, mask=done)
        # the barrier orders every thread's stores before the one-thread release; the
        # acquire makes the other shares' partials visible to the last arrival
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + block, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_R, 16], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):  # split order: the same sum every run
                share_sums = partial_ptr + s * 16 * N + at
                acc += tl.load(share_sums, mask=done, other=0.0, cache_modifier=".cg")
            out = out_ptr + cols.to(tl.int64)[None, :] * stride_om + rows[:, None]
            tl.store(out, acc.to(dtype), mask=done)
            tl.store(counter_ptr + block, 0)  # every share arrived: ready for the next launch
    else:
        out = out_ptr + cols.to(tl.int64)[None, :] * stride_om + rows[:, None]
        tl.store(out, acc.to(dtype), mask=done)


def gemv_mma(
    x: torch.Tensor,  # [M, K] ([M, 2K] gate then up when gated), M <= 16
    weight: torch.Tensor,  # [N, K], unit stride on K
    out: torch.Tensor,  # [M, N] in x's dtype
    *,
    config: MmaConfig,
    gated: bool = False,
) -> torch.Tensor:
    """``x @ weight.T`` (``silu_and_mul(x) @ weight.T`` when gated) into ``out``."""
    m, width = x.shape
    k = width // 2 if gated else width
    n = weight.shape[0]
    split = config.split_k
    if (
        m > X_COLUMNS
        or weight.shape[1] != k
        or k % (config.block_k * split)
        or weight.stride(1) != 1
    ):
        raise ValueError(f"gemv_mma: x {tuple(x.shape)}, weight {tuple(weight.shape)}, {config}")
    blocks = triton.cdiv(n, config.block_r)
    if split > 1:  # scratch per launch: a graph captures it; the counters are persistent
        partial = torch.empty(split, X_COLUMNS, n, dtype=torch.float32, device=x.device)
        counters = arrival_counters(COUNTERS, x.device, blocks)
    else:
        partial = counters = out  # not read
    _gemv_mma_kernel[(blocks, split)](
        x, weight, out, partial, counters, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_R=config.block_r, BLOCK_K=config.block_k, GATED=gated, PEEL=config.peel,
        ONE_ROW=m == 1, SPLIT_K=split, UPCAST=not x.is_cuda,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **pdl_launch(config.pdl, x.device),
    )  # fmt: skip
    return out
