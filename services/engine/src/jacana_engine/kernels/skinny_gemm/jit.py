"""Jit helpers the skinny GEMM kernels share: the weight and x tile loads (x plain, or a
gated MLP's gate_up activated as it loads) and the folded kernels' loop.

Weights load with ``cache_modifier=".cg"``: cached in L2 only, so the weight, read once,
streams past L1 and leaves it to x, which every program of an SM reads again (on an
H200 Qwen3-8B's one-row layer chain ran 3-9 us faster so, at the same energy).
"""

from __future__ import annotations

import triton
import triton.language as tl

from jacana_engine.kernels.activation import silu_mul_rounded


@triton.jit
def w_tile(w_rows, k, n_mask, K):
    """The weight's [BLOCK_N, BLOCK_K] tile at columns ``k`` of rows ``w_rows``
    [BLOCK_N, 1]; zero where masked."""
    return tl.load(
        w_rows + k[None, :], mask=n_mask[:, None] & (k < K)[None, :], other=0.0,
        cache_modifier=".cg",
    )  # fmt: skip


@triton.jit
def x_tile(x_rows, k, m_mask, K, GATED: tl.constexpr, dtype: tl.constexpr):
    """x's [BLOCK_M, BLOCK_K] tile at columns ``k`` of rows ``x_rows`` [BLOCK_M, 1] in
    ``dtype``; with GATED the rows hold gate then up (K each) and the tile is
    ``silu(gate) * up``, rounded as ``kernels.activation`` rounds it. Zero where masked."""
    x_mask = m_mask[:, None] & (k < K)[None, :]
    x = tl.load(x_rows + k[None, :], mask=x_mask, other=0.0)
    if GATED:  # padding stays zero: silu(0) * 0
        up = tl.load(x_rows + K + k[None, :], mask=x_mask, other=0.0)
        x = silu_mul_rounded(x.to(tl.float32), up.to(tl.float32), dtype)
    return x


@triton.jit
def folded_w_tile(w_rows, k, n_mask, K):
    """The weight's tile at columns ``k`` [KK, F] of rows ``w_rows`` [BLOCK_N, 1, 1]:
    [BLOCK_N, KK, F], zero where masked."""
    return tl.load(
        w_rows + k[None, :, :], mask=n_mask[:, None, None] & (k < K)[None, :, :], other=0.0,
        cache_modifier=".cg",
    )  # fmt: skip


@triton.jit
def folded_x_tile(x_ptr, k, K, GATED: tl.constexpr, dtype: tl.constexpr):
    """x's one row at columns ``k`` [KK, F], in ``dtype``, activated (GATED) as
    ``x_tile`` activates it; zero where masked."""
    x = tl.load(x_ptr + k, mask=k < K, other=0.0)
    if GATED:  # padding stays zero: silu(0) * 0
        up = tl.load(x_ptr + K + k, mask=k < K, other=0.0)
        x = silu_mul_rounded(x.to(tl.float32), up.to(tl.float32), dtype)
    return x


@triton.jit
def folded_accumulate(acc, x, w):
    """acc [BLOCK_N, KK] += the products of x [KK, F] and w [BLOCK_N, KK, F], each
    thread's F neighbours (one vector load) added first, in registers. (Three
    dimensions, as the loads: a fourth, for more rows of x, makes Triton move every
    tile through shared memory to another layout.)"""
    return acc + tl.sum(x.to(tl.float32)[None, :, :] * w.to(tl.float32), axis=2)


@triton.jit
def folded_row_sums(
    x_ptr, w_ptr, rows, n_mask, K, stride_wn,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr,
    GATED: tl.constexpr, PEEL: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One row of x times the weight rows ``rows`` [BLOCK_N]: [BLOCK_N] float32 sums,
    each K tile split into [BLOCK_K / F, F] so that a thread adds the F products of its
    vector load at once. With PDL: lets the next kernel launch, loads the first tile
    (PEEL 1), waits for the previous kernel, then reads x; the prefetched tile first,
    then the rest: the same order of sums either way."""
    KK: tl.constexpr = BLOCK_K // FOLD
    ks = tl.arange(0, KK)[:, None] * FOLD + tl.arange(0, FOLD)[None, :]  # [KK, F]
    w_rows = w_ptr + rows.to(tl.int64)[:, None, None] * stride_wn  # [BLOCK_N, 1, 1]
    dtype = x_ptr.dtype.element_ty
    if PDL:  # the next kernel may launch now: it waits for all of this one before reading
        tl.extra.cuda.gdc_launch_dependents()
    # weights are never written by other kernels: no need to wait for them
    if PEEL >= 1:
        w_first = folded_w_tile(w_rows, ks, n_mask, K)
    if PDL:  # everything below may read what the previous kernel wrote
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BLOCK_N, KK], dtype=tl.float32)
    start = 0
    if PEEL >= 1:
        acc = folded_accumulate(acc, folded_x_tile(x_ptr, ks, K, GATED, dtype), w_first)
        start = BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        x = folded_x_tile(x_ptr, k0 + ks, K, GATED, dtype)
        acc = folded_accumulate(acc, x, folded_w_tile(w_rows, k0 + ks, n_mask, K))
    return tl.sum(acc, axis=1)
