"""The tile kernel: x [M <= 16, K] (plain, or a gated MLP's gate_up activated as it loads)
times weight [N, K]^T, each program owning BLOCK_N output columns for all M rows.

Two inner products (``SkinnyConfig.use_dot``): ``tl.dot`` with x padded to 16 rows
(tensor cores; the padding is free, the kernel is memory bound), from ``DOT_MIN_M`` rows
up; below, a broadcast multiply (no padding, no shared-memory round trip for the
weight), its products accumulated elementwise over the K steps and summed over BLOCK_K
once at the end. Deterministic: each output element is reduced over K by one program in
a fixed order, no split-K, so results are bitwise identical run to run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._common import dot_precision
from jacana_engine.kernels._pdl import pdl_launch
from jacana_engine.kernels.skinny_gemm.config import SkinnyConfig
from jacana_engine.kernels.skinny_gemm.jit import w_tile, x_tile


@triton.jit
def _accumulate(acc, x, w, USE_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """acc += x [BLOCK_M, BLOCK_K] times w [BLOCK_N, BLOCK_K]: into [BLOCK_M, BLOCK_N] by
    tl.dot, or elementwise into [BLOCK_M, BLOCK_N, BLOCK_K] (summed over K at the end: a
    reduction per step, warp shuffles, would cost more than the loads it follows)."""
    if USE_DOT:
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION, out_dtype=tl.float32)
    else:
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _tile_kernel(
    x_ptr,  # [M, K] ([M, 2K] gate then up with GATED)
    w_ptr,  # [N, K]
    out_ptr,  # [M, N]
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    GATED: tl.constexpr,  # x rows hold gate then up, K each: x = silu(gate) * up
    PEEL: tl.constexpr,  # load the first PEEL (0-2) weight tiles before anything else
    PDL: tl.constexpr,  # launched with PDL: trigger dependents, wait after those tiles
    LOOKAHEAD: tl.constexpr,  # the loop loads a weight tile ahead (SkinnyConfig)
):
    rows = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    m_mask = rows < M
    n_mask = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    dtype = x_ptr.dtype.element_ty
    if PDL:  # the next kernel may launch now: it waits for all of this one before reading
        tl.extra.cuda.gdc_launch_dependents()
    # weights are never written by other kernels: no need to wait for them
    if PEEL >= 1:
        w_first = w_tile(w_rows, ks, n_mask, K)
    if PEEL >= 2:
        w_second = w_tile(w_rows, BLOCK_K + ks, n_mask, K)
    if PDL:  # everything below may read what the previous kernel wrote
        tl.extra.cuda.gdc_wait()
    if LOOKAHEAD:  # the loop's first tile: on its way from HBM while x comes from L2
        w_next = w_tile(w_rows, PEEL * BLOCK_K + ks, n_mask, K)
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    # the prefetched tiles first, then the rest: the same order of sums either way
    start = 0
    if PEEL >= 1:
        x = x_tile(x_rows, ks, m_mask, K, GATED, dtype)
        acc = _accumulate(acc, x, w_first, USE_DOT, PRECISION)
        start = BLOCK_K
    if PEEL >= 2:
        x = x_tile(x_rows, BLOCK_K + ks, m_mask, K, GATED, dtype)
        acc = _accumulate(acc, x, w_second, USE_DOT, PRECISION)
        start = 2 * BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        k = k0 + ks
        if LOOKAHEAD:  # the next tile asked for before this one is used (none past K)
            w = w_next
            w_next = w_tile(w_rows, k + BLOCK_K, n_mask, K)
            x = x_tile(x_rows, k, m_mask, K, GATED, dtype)
        else:
            x = x_tile(x_rows, k, m_mask, K, GATED, dtype)
            w = w_tile(w_rows, k, n_mask, K)
        acc = _accumulate(acc, x, w, USE_DOT, PRECISION)
    if not USE_DOT:
        acc = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def tile_linear(
    x: torch.Tensor,  # [M, K] ([M, 2K] with ``gated``), checked by ``skinny_linear``
    weight: torch.Tensor,  # [N, K]
    out: torch.Tensor,  # [M, N]
    cfg: SkinnyConfig,
    gated: bool,
) -> torch.Tensor:
    """``skinny_linear``'s product on the tile kernel (inputs already checked). Raises
    ``ValueError`` for a config of fewer rows a program than x has."""
    m = x.shape[0]
    n, k = weight.shape
    if cfg.block_m < m:
        raise ValueError(f"config block_m={cfg.block_m} < {m} rows")
    launch = pdl_launch(cfg.pdl, x.device)
    _tile_kernel[cfg.grid(n)](
        x, weight, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, USE_DOT=cfg.use_dot,
        PRECISION=dot_precision(x.dtype), GATED=gated,
        PEEL=cfg.prefetch_tiles if cfg.pdl else 0,  # elsewhere than on CUDA only the order
        LOOKAHEAD=cfg.lookahead, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch,
    )  # fmt: skip
    return out


def tile_linear_ref(
    x: torch.Tensor,  # [M, K] ([M, 2K] gate then up with ``gated``)
    weight: torch.Tensor,  # [N, K]
    gated: bool = False,
) -> torch.Tensor:  # [M, N] in x's dtype
    """The torch reference of the tile and folded kernels: ``x @ weight.T`` (x first
    activated as ``silu_and_mul`` rounds it, with ``gated``) with float64 products and
    sums, rounded once to x's dtype. The kernels sum in float32 in their own orders."""
    if gated:
        gate, up = x.double().chunk(2, dim=-1)
        x = (torch.nn.functional.silu(gate).to(x.dtype).double() * up).to(x.dtype)
    return (x.double() @ weight.double().T).to(x.dtype)
