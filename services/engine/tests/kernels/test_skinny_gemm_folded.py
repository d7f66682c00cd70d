"""The folded kernel (``kernels/skinny_gemm/folded.py``): one row against float64 truth,
the same bits run after run and with or without PDL, and what it refuses."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from skinny_cases import QWEN3_SHAPES, check_product

from jacana_engine.kernels.activation import silu_and_mul
from jacana_engine.kernels.skinny_gemm import (
    FOLD,
    SkinnyConfig,
    candidate_configs,
    skinny_linear,
)

# (K, N, gated, dtype, BLOCK_N, BLOCK_K): ragged last rows and K step, a gated x, float32
FOLDED_CASES = [
    (200, 100, False, torch.bfloat16, 8, 64),
    (96, 77, True, torch.bfloat16, 4, 32),
    (1000, 40, False, torch.float32, 2, 256),
    (72, 300, True, torch.float32, 16, 16),
]


@pytest.mark.parametrize("k,n,gated,dtype,block_n,block_k", FOLDED_CASES)
def test_folded_kernel_matches(device, seed, checks, k, n, gated, dtype, block_n, block_k):
    """The folded kernel's product against float64 truth (its sums come in another order
    than the tile kernel's: close, not the same bits), run after run the same bits, with
    and without PDL; gated, against silu_and_mul's rounded activation."""
    x = torch.randn(1, 2 * k if gated else k, device=device).to(dtype)
    w = torch.randn(n, k, device=device).to(dtype)
    rows = silu_and_mul(x) if gated else x
    outs = []
    for pdl in (False, True):
        cfg = SkinnyConfig(1, block_n, block_k, False, pdl=pdl, k_fold=FOLD)
        out = torch.full((1, n), float("nan"), device=device, dtype=dtype)  # poisoned
        outs.append(skinny_linear(x, w, out, config=cfg, gated=gated))
        check_product(out, rows, w, seed, checks, f"1x{k}x{n} {cfg}")
    assert torch.equal(outs[0], outs[1]), f"seed={seed}"


def test_folded_kernel_refuses_what_it_cannot_run(device):
    x, w = torch.randn(2, 32, device=device), torch.randn(64, 32, device=device)
    folded = SkinnyConfig(2, 8, 32, False, k_fold=FOLD)
    with pytest.raises(ValueError, match="one row"):
        skinny_linear(x, w, config=folded)
    with pytest.raises(ValueError, match="one row"):  # a fold that does not divide BLOCK_K
        skinny_linear(x[:1], w, config=dataclasses.replace(folded, block_m=1, k_fold=64))
    for tile_kernel_only in ({"lookahead": True}, {"prefetch_tiles": 2}):
        with pytest.raises(ValueError, match="no lookahead and one tile"):
            one = dataclasses.replace(folded, block_m=1, pdl=True, **tile_kernel_only)
            skinny_linear(x[:1], w, config=one)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(QWEN3_SHAPES))
def test_folded_kernel_at_qwen3_sizes_gpu(gpu, device, seed, checks, name):
    """Every folded one-row candidate (PDL, as the engine launches them) at each Qwen3
    shape, the down projections gated: against float64 truth, and its bits run after
    run."""
    k, n = QWEN3_SHAPES[name]
    gated = name.endswith("down")
    w = (torch.randn(n, k, device=device) * k**-0.5).bfloat16()
    x = torch.randn(1, 2 * k if gated else k, device=device).bfloat16()
    rows = silu_and_mul(x) if gated else x
    folded = [c for c in candidate_configs(1, n, k, pdl=True, folded=True) if c.k_fold > 1]
    assert folded, name
    for cfg in folded:
        out = torch.full((1, n), float("nan"), device=device, dtype=x.dtype)
        skinny_linear(x, w, out, config=cfg, gated=gated)
        check_product(out, rows, w, seed, checks, f"{name} {cfg}")
        again = skinny_linear(x, w, config=cfg, gated=gated)
        assert torch.equal(again, out), f"{name} {cfg} seed={seed}: not deterministic"
