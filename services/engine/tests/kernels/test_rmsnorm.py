"""RMSNorm and fused residual-add + RMSNorm against the HF-ordered reference.

Tolerance: float32 within 4 ulp (float32 vs float64 statistics); bfloat16 within 2 ulp
(both sides round at the same points, but the float32 statistics and the approximate
rsqrt may flip the last bit of the normalized value, which the weight product can carry
to a second ulp: seen on 9 of 16.8M elements on an H200).
Outputs are poisoned with NaN; out-of-place calls must leave the inputs unmodified, and the
in-place form must give the same bits.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels.reference import (
    fused_add_rms_norm_reference,
    rms_norm_reference,
)
from jacana_engine.kernels.rmsnorm import fused_add_rms_norm, rms_norm

ULPS = {torch.float32: 4, torch.bfloat16: 2}


def _dtypes(device) -> list[torch.dtype]:
    return [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]


def _check(device, seed, checks, tokens, hidden, dtype) -> None:
    eps = 1e-6
    x = (torch.randn(tokens, hidden, device=device) * 3).to(dtype)
    residual = torch.randn(tokens, hidden, device=device).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
    x_in, r_in = x.clone(), residual.clone()
    what = f"{dtype} hidden={hidden}"

    out = torch.full_like(x, float("nan"))
    rms_norm(x, weight, eps, out=out)
    ref = rms_norm_reference(x, weight, eps)
    checks.ulps(out, ref, ulps=ULPS[dtype], seed=seed, what=f"rms_norm {what}")

    normed = torch.full_like(x, float("nan"))
    new_residual = torch.full_like(x, float("nan"))
    fused_add_rms_norm(x, residual, weight, eps, out=normed, residual_out=new_residual)
    ref_normed, ref_residual = fused_add_rms_norm_reference(x, residual, weight, eps)
    assert torch.equal(new_residual, ref_residual), f"seed={seed}: residual sum differs"
    checks.ulps(normed, ref_normed, ulps=ULPS[dtype], seed=seed, what=f"fused {what}")
    assert torch.equal(x, x_in) and torch.equal(residual, r_in), f"seed={seed}: inputs modified"

    # in place, as a decoder layer chains it
    fused_add_rms_norm(x, residual, weight, eps, out=x, residual_out=residual)
    assert torch.equal(x, normed) and torch.equal(residual, ref_residual), f"seed={seed}"


@pytest.mark.parametrize("tokens,hidden", [(7, 96), (3, 1000)])
def test_rms_norm_small(device, seed, checks, tokens, hidden):
    for dtype in _dtypes(device):
        _check(device, seed, checks, tokens, hidden, dtype)


def test_rms_norm_strided_rows(device, seed, checks):
    """Rows of a wider buffer (row stride != hidden)."""
    base = torch.randn(5, 80, device=device)
    x = base[:, :64]
    weight = torch.randn(64, device=device)
    checks.ulps(rms_norm(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5), ulps=4, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [4096, 5120])
def test_rms_norm_gpu(gpu, device, seed, checks, hidden):
    _check(device, seed, checks, 4096, hidden, torch.bfloat16)
