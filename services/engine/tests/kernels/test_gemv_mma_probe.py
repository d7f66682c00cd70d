"""``bench/gemv_mma.py``, the power probe's tensor-core decode GEMV (the weight as the MMA's
wide operand, x's rows padded to 16), against the float32 reference, so the energy it is
measured at is that of a kernel that computes the product.

Under the CPU interpreter it multiplies in float32 (the interpreter's ``tl.dot`` misreads
bfloat16) and only the final rounding to bfloat16 differs from the reference; on CUDA the
tensor cores sum bfloat16 products in their own order. Either way an output may round
to its bf16 neighbour: the bound is 2e-2 of the largest output (two ulps of it).
Outputs start as NaN, so an element never stored shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "bench"))

from gemv_mma import MmaConfig, gemv_mma

from jacana_engine.kernels.reference import silu_and_mul_reference, skinny_linear_ref


@pytest.mark.parametrize("peel", [False, True])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_the_tensor_core_gemv_computes_the_product(device, seed, m, gated, peel):
    # small here (the interpreter); N not a multiple of the tile: the masked last block
    n, k = (200, 256) if device.type == "cpu" else (4096, 4096)
    x = torch.randn(m, 2 * k if gated else k, device=device).to(torch.bfloat16)
    w = (torch.randn(n, k, device=device) * k**-0.5).to(torch.bfloat16)
    out = torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16)
    config = MmaConfig(64, 128, pdl=device.type == "cuda", peel=peel)
    gemv_mma(x, w, out, config=config, gated=gated)
    ref = skinny_linear_ref(silu_and_mul_reference(x) if gated else x, w).float()
    err = float((out.float() - ref).abs().max() / ref.abs().max())
    assert err < 2e-2, f"seed {seed}: relative error {err}"


def test_a_k_the_tile_does_not_divide_is_refused(device):
    x = torch.randn(1, 96, device=device).to(torch.bfloat16)
    w = torch.randn(8, 96, device=device).to(torch.bfloat16)
    with pytest.raises(ValueError, match="gemv_mma"):
        gemv_mma(
            x, w, torch.empty(1, 8, device=device, dtype=torch.bfloat16), config=MmaConfig(64, 64)
        )
