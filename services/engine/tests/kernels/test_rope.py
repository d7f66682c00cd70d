"""RoPE and Qwen3's q/k-norm + RoPE against the HF-ordered reference.

Tolerance: float32 ‖out − ref‖/‖ref‖ <= 1e-6 and max error <= 1e-5 of max|ref| (the
rotation's differences cancel, so no per-element ulp bound); bfloat16 rounds at HF's points
on both sides, so at most 1% of elements may differ (a last-bit flip of the float32 norm
statistics carries through), rel-L2 <= 2e-3, max error <= 1.6e-2 of max|ref|.
Out-of-place outputs are poisoned with NaN; in-place runs on a copy.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels.reference import (
    build_cos_sin_cache,
    qk_norm_rope_reference,
    rope_reference,
)
from jacana_engine.kernels.rope import qk_norm_rope, rope


def _inv_freq(rotary_dim: int, theta: float = 1e6) -> torch.Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (theta**exponents)


def _qkv(tokens, n_q, n_kv, head_dim, dtype, device):
    # q and k as views into one fused projection output, as the model produces them
    qkv = torch.randn(tokens, (n_q + 2 * n_kv) * head_dim, device=device).to(dtype)
    q = qkv[:, : n_q * head_dim].view(tokens, n_q, head_dim)
    k = qkv[:, n_q * head_dim : (n_q + n_kv) * head_dim].view(tokens, n_kv, head_dim)
    return q, k


def _check(
    device, seed, checks, *, tokens, n_q, n_kv, head_dim, rotary_dim, max_pos, dtype, qk_norm
):
    q, k = _qkv(tokens, n_q, n_kv, head_dim, dtype, device)
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    cache = build_cos_sin_cache(_inv_freq(rotary_dim).to(device), max_pos)
    eps = 1e-6
    q_out = torch.full_like(q, float("nan"))
    k_out = torch.full_like(k, float("nan"))
    if qk_norm:
        qw = (1 + 0.2 * torch.randn(head_dim, device=device)).to(dtype)
        kw = (1 + 0.2 * torch.randn(head_dim, device=device)).to(dtype)
        ref_q = qk_norm_rope_reference(q, qw, eps, positions, cache)
        ref_k = qk_norm_rope_reference(k, kw, eps, positions, cache)
        qk_norm_rope(positions, q, k, qw, kw, eps, cache, q_out=q_out, k_out=k_out)
        q2, k2 = q.clone(), k.clone()
        qk_norm_rope(positions, q2, k2, qw, kw, eps, cache)
    else:
        ref_q = rope_reference(q, positions, cache)
        ref_k = rope_reference(k, positions, cache)
        rope(positions, q, k, cache, q_out=q_out, k_out=k_out)
        q2, k2 = q.clone(), k.clone()
        rope(positions, q2, k2, cache)
    what = f"{'qk_norm_rope' if qk_norm else 'rope'} {dtype} rot={rotary_dim}"
    for out, ref, name in (
        (q_out, ref_q, "q"),
        (k_out, ref_k, "k"),
        (q2, ref_q, "q in place"),
        (k2, ref_k, "k in place"),
    ):
        if dtype == torch.float32:
            checks.close(out, ref, rel_l2=1e-6, max_rel=1e-5, seed=seed, what=f"{what} {name}")
        else:
            checks.close(out, ref, rel_l2=2e-3, max_rel=1.6e-2, seed=seed, what=f"{what} {name}")
            checks.mostly_equal(out, ref, max_fraction=0.01, seed=seed, what=f"{what} {name}")


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (64, 32), (48, 48)])
def test_rope_small(device, seed, checks, qk_norm, head_dim, rotary_dim):
    dtypes = [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]
    for dtype in dtypes:
        _check(
            device,
            seed,
            checks,
            tokens=9,
            n_q=4,
            n_kv=2,
            head_dim=head_dim,
            rotary_dim=rotary_dim,
            max_pos=300,
            dtype=dtype,
            qk_norm=qk_norm,
        )


def test_rope_leaves_other_buffer_alone(device, seed):
    """In place on views of a fused QKV buffer: the V part is untouched."""
    tokens, n_q, n_kv, d = 6, 2, 1, 32
    qkv = torch.randn(tokens, (n_q + 2 * n_kv) * d, device=device)
    before = qkv.clone()
    q = qkv[:, : n_q * d].view(tokens, n_q, d)
    k = qkv[:, n_q * d : (n_q + n_kv) * d].view(tokens, n_kv, d)
    cache = build_cos_sin_cache(_inv_freq(d).to(device), 64)
    rope(torch.randint(1, 64, (tokens,), device=device), q, k, cache)
    assert torch.equal(qkv[:, (n_q + n_kv) * d :], before[:, (n_q + n_kv) * d :]), f"seed={seed}"
    assert not torch.equal(qkv[:, : n_q * d], before[:, : n_q * d]), f"seed={seed}"


@pytest.mark.gpu
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_gpu_qwen3_8b(gpu, device, seed, checks, qk_norm):
    _check(
        device,
        seed,
        checks,
        tokens=4096,
        n_q=32,
        n_kv=8,
        head_dim=128,
        rotary_dim=128,
        max_pos=40960,
        dtype=torch.bfloat16,
        qk_norm=qk_norm,
    )
