"""The activating kernel: the folded kernel's one-row product with a gated MLP's gate_up
weight [2I, K] (gate rows [0, I), then up rows [I, 2I)), stored activated:
``silu(gate) * up`` [1, I] (``SkinnyConfig.activates``).

A program takes BLOCK_N / 2 pairs, gate row j beside up row I + j, and activates them as
it stores, so the down projection after it reads I activated columns instead of
activating in every one of its programs. The sums are the folded kernel's for this
tile, each rounded as stored, then activated as ``kernels.activation`` rounds it: the
bits of the plain folded launch of this tile followed by ``silu_and_mul``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._pdl import pdl_launch
from jacana_engine.kernels.activation import silu_mul_rounded
from jacana_engine.kernels.skinny_gemm.config import SkinnyConfig
from jacana_engine.kernels.skinny_gemm.folded import check_folded
from jacana_engine.kernels.skinny_gemm.jit import folded_row_sums


@triton.jit
def _activating_kernel(
    x_ptr,  # [1, K]
    w_ptr,  # [2I, K]: gate then up
    out_ptr,  # [1, I]
    N,  # 2I
    K,
    stride_wn,
    BLOCK_N: tl.constexpr,  # even: BLOCK_N / 2 pairs
    BLOCK_K: tl.constexpr,
    FOLD: tl.constexpr,
    PEEL: tl.constexpr,
    PDL: tl.constexpr,
):
    half = N // 2  # I
    lane = tl.arange(0, BLOCK_N)
    pair = tl.program_id(0) * (BLOCK_N // 2) + lane // 2  # [BLOCK_N]: j, j, j+1, j+1, ...
    rows = pair + (lane % 2) * half  # [BLOCK_N]: gate j, up j, gate j+1, up j+1, ...
    total = folded_row_sums(
        x_ptr, w_ptr, rows, pair < half, K, stride_wn, BLOCK_N, BLOCK_K, FOLD, False, PEEL, PDL
    )  # [BLOCK_N] float32
    dtype = out_ptr.dtype.element_ty
    product = total.to(dtype)  # rounded as stored
    gate, up = tl.split(tl.reshape(product, [BLOCK_N // 2, 2]))
    act = silu_mul_rounded(gate.to(tl.float32), up.to(tl.float32), dtype)
    pairs = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    tl.store(out_ptr + pairs, act, mask=pairs < half)


def activating_linear(
    x: torch.Tensor,  # [1, K], checked by ``skinny_linear``
    weight: torch.Tensor,  # [2I, K]
    out: torch.Tensor,  # [1, I]
    cfg: SkinnyConfig,
) -> torch.Tensor:
    """``skinny_linear``'s activated product (inputs already checked). Raises
    ``ValueError`` where ``folded.check_folded`` does, or for odd N or BLOCK_N."""
    check_folded(cfg, x.shape[0])
    n, k = weight.shape
    if n % 2 or cfg.block_n % 2:
        raise ValueError(
            f"an activating launch takes whole pairs of rows (even BLOCK_N and N), got "
            f"BLOCK_N={cfg.block_n}, N={n}"
        )
    launch = pdl_launch(cfg.pdl, x.device)
    _activating_kernel[cfg.grid(n)](
        x, weight, out, n, k, weight.stride(0),
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, FOLD=cfg.k_fold,
        PEEL=1 if launch["PDL"] else 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch,
    )  # fmt: skip
    return out


def activating_linear_ref(
    x: torch.Tensor,  # [1, K]
    weight: torch.Tensor,  # [2I, K]: gate then up
) -> torch.Tensor:  # [1, I] in x's dtype
    """The torch reference: ``x @ weight.T`` in float64, rounded to x's dtype, then
    ``silu(gate) * up`` of its halves, rounded as ``silu_and_mul`` rounds it."""
    y = (x.double() @ weight.double().T).to(x.dtype)
    gate, up = y.double().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate).to(x.dtype).double() * up).to(x.dtype)
