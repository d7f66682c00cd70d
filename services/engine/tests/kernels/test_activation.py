"""silu_and_mul against the HF-ordered reference.

Tolerance: float32 within 8 ulp (exp in float32); bfloat16 within 2 ulp (the float32
silu may round to the neighbouring bf16 value, which the product can carry one more)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels.activation import silu_and_mul
from jacana_engine.kernels.reference import silu_and_mul_reference

ULPS = {torch.float32: 8, torch.bfloat16: 2}


def _check(device, seed, checks, tokens, inter, dtype) -> None:
    x = (torch.randn(tokens, 2 * inter, device=device) * 4).to(dtype)
    out = torch.full((tokens, inter), float("nan"), device=device, dtype=dtype)
    silu_and_mul(x, out=out)
    checks.ulps(
        out,
        silu_and_mul_reference(x),
        ulps=ULPS[dtype],
        seed=seed,
        what=f"silu_and_mul {dtype} {inter}",
    )


@pytest.mark.parametrize("tokens,inter", [(5, 300), (2, 2500)])
def test_silu_and_mul_small(device, seed, checks, tokens, inter):
    dtypes = [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]
    for dtype in dtypes:
        _check(device, seed, checks, tokens, inter, dtype)


@pytest.mark.gpu
def test_silu_and_mul_gpu(gpu, device, seed, checks):
    _check(device, seed, checks, 4096, 12288, torch.bfloat16)
