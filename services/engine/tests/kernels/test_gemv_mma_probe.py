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


def _product_error(device, m: int, gated: bool, config: MmaConfig) -> float:
    """max |gemv_mma - reference| / max |reference| on fresh random inputs."""
    # small here (the interpreter); N not a multiple of the tile: the masked last block
    n, k = (200, 256) if device.type == "cpu" else (4096, 4096)
    x = torch.randn(m, 2 * k if gated else k, device=device).to(torch.bfloat16)
    w = (torch.randn(n, k, device=device) * k**-0.5).to(torch.bfloat16)
    out = torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16)
    gemv_mma(x, w, out, config=config, gated=gated)
    ref = skinny_linear_ref(silu_and_mul_reference(x) if gated else x, w).float()
    return float((out.float() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("peel", [False, True])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_the_tensor_core_gemv_computes_the_product(device, seed, m, gated, peel):
    config = MmaConfig(64, 128, pdl=device.type == "cuda", peel=peel)
    err = _product_error(device, m, gated, config)
    assert err < 2e-2, f"seed {seed}: relative error {err}"


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("m", [1, 5])
def test_split_k_shares_add_up_to_the_product_twice_in_a_row(device, seed, m, gated):
    # the second launch finds the arrival counters the first one reset
    config = MmaConfig(64, 64, pdl=device.type == "cuda", peel=True, split_k=2)
    for _ in range(2):
        err = _product_error(device, m, gated, config)
        assert err < 2e-2, f"seed {seed}: relative error {err}"


def test_split_k_gives_the_same_bits_every_run(device):
    k = 256 if device.type == "cpu" else 4096
    x = torch.randn(1, k, device=device).to(torch.bfloat16)
    w = torch.randn(96, k, device=device).to(torch.bfloat16)
    config = MmaConfig(32, 64, split_k=4)
    runs = [gemv_mma(x, w, torch.empty(1, 96, device=device, dtype=torch.bfloat16), config=config)
            for _ in range(3)]  # fmt: skip
    assert all(torch.equal(runs[0], r) for r in runs[1:])


@pytest.mark.parametrize("config", [MmaConfig(64, 64), MmaConfig(64, 32, split_k=2)])
def test_a_k_the_tiles_do_not_divide_is_refused(device, config):
    x = torch.randn(1, 96, device=device).to(torch.bfloat16)
    w = torch.randn(8, 96, device=device).to(torch.bfloat16)
    with pytest.raises(ValueError, match="gemv_mma"):
        gemv_mma(x, w, torch.empty(1, 8, device=device, dtype=torch.bfloat16), config=config)
