"""The folded kernel: one row of x (plain, or a gated MLP's gate_up activated as it
loads) times weight [N, K]^T, each K tile loaded as [BLOCK_N, BLOCK_K / F, F] so that
each thread adds its F neighbouring products at once (``SkinnyConfig.k_fold``).

Its running sums take an F-th of the tile kernel's registers, so an SM holds more
programs and more weight bytes in flight: the tuner's pick for most Qwen3-8B shapes at
batch 1 on an H200. Another order of sums than the tile kernel's, fixed per config.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._pdl import pdl_launch
from jacana_engine.kernels.skinny_gemm.config import SkinnyConfig
from jacana_engine.kernels.skinny_gemm.jit import folded_row_sums


@triton.jit
def _folded_kernel(
    x_ptr,  # [1, K] ([1, 2K] gated)
    w_ptr,  # [N, K]
    out_ptr,  # [1, N]
    N,
    K,
    stride_wn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FOLD: tl.constexpr,  # F: neighbouring products a thread adds at each K step
    GATED: tl.constexpr,  # x holds gate then up, K each: x = silu(gate) * up
    PEEL: tl.constexpr,  # weight tiles loaded before anything else (0 or 1)
    PDL: tl.constexpr,  # launched with PDL: trigger dependents, wait after the PEEL tile
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    n_mask = rows < N
    total = folded_row_sums(
        x_ptr, w_ptr, rows, n_mask, K, stride_wn, BLOCK_N, BLOCK_K, FOLD, GATED, PEEL, PDL
    )  # [BLOCK_N] float32
    tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=n_mask)


def check_folded(cfg: SkinnyConfig, rows: int) -> None:
    """Raise ``ValueError`` unless the folded kernels can run ``cfg`` on ``rows`` rows:
    one row on the sum path, a fold that is a power of 2 dividing BLOCK_K, one tile
    before the wait and no lookahead (the tile kernel's alone)."""
    fold = cfg.k_fold
    if rows != 1 or cfg.use_dot or fold & (fold - 1) or cfg.block_k % fold:
        raise ValueError(
            f"k_fold={fold} takes one row on the sum path, a power of 2 dividing BLOCK_K"
        )
    if cfg.lookahead or cfg.prefetch_tiles != 1:
        raise ValueError("a k_fold config takes no lookahead and one tile before its wait")


def folded_linear(
    x: torch.Tensor,  # [1, K] ([1, 2K] with ``gated``), checked by ``skinny_linear``
    weight: torch.Tensor,  # [N, K]
    out: torch.Tensor,  # [1, N]
    cfg: SkinnyConfig,
    gated: bool,
) -> torch.Tensor:
    """``skinny_linear``'s product on the folded kernel (inputs already checked; raises
    ``ValueError`` where ``check_folded`` does). Its torch reference is the tile
    kernel's, ``tile.tile_linear_ref``."""
    check_folded(cfg, x.shape[0])
    n, k = weight.shape
    launch = pdl_launch(cfg.pdl, x.device)
    _folded_kernel[cfg.grid(n)](
        x, weight, out, n, k, weight.stride(0),
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, FOLD=cfg.k_fold, GATED=gated,
        PEEL=1 if launch["PDL"] else 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch,
    )  # fmt: skip
    return out
