"""kv_cache_write against its reference. The write is a copy: results must be exact in
every dtype. The cache is poisoned with NaN so that a skipped or misplaced write shows."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels.kv_cache_write import kv_cache_write
from jacana_engine.kernels.reference import kv_cache_write_reference


def _check(device, seed, *, tokens, n_kv, head_dim, block_size, num_blocks, dtype) -> None:
    k = torch.randn(tokens, n_kv, head_dim, device=device).to(dtype)
    v = torch.randn(tokens, n_kv, head_dim, device=device).to(dtype)
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]
    slots[torch.rand(tokens, device=device) < 0.1] = -1  # padding tokens
    cache = torch.full((2, num_blocks, block_size, n_kv, head_dim), float("nan"), device=device)
    cache = cache.to(dtype)
    expected = kv_cache_write_reference(k, v, cache, slots)
    kv_cache_write(k, v, cache, slots)
    _assert_same(cache, expected, seed)


def _assert_same(cache: torch.Tensor, expected: torch.Tensor, seed: int) -> None:
    # untouched slots hold the NaN poison on both sides
    same = (cache == expected) | (cache.isnan() & expected.isnan())
    assert same.all(), f"seed={seed}: {int((~same).sum())} cache elements differ"


@pytest.mark.parametrize("n_kv,head_dim", [(2, 64), (3, 48)])
def test_kv_cache_write_small(device, seed, n_kv, head_dim):
    _check(
        device,
        seed,
        tokens=37,
        n_kv=n_kv,
        head_dim=head_dim,
        block_size=16,
        num_blocks=5,
        dtype=torch.float32,
    )


def test_kv_cache_write_strided_views(device, seed):
    """k and v as slices of one fused QKV projection output."""
    tokens, n_q, n_kv, head_dim = 19, 4, 2, 32
    qkv = torch.randn(tokens, (n_q + 2 * n_kv) * head_dim, device=device)
    k = qkv[:, n_q * head_dim : (n_q + n_kv) * head_dim].view(tokens, n_kv, head_dim)
    v = qkv[:, (n_q + n_kv) * head_dim :].view(tokens, n_kv, head_dim)
    slots = torch.randperm(4 * 8, device=device)[:tokens]
    cache = torch.full((2, 4, 8, n_kv, head_dim), float("nan"), device=device)
    expected = kv_cache_write_reference(k, v, cache, slots)
    kv_cache_write(k, v, cache, slots)
    _assert_same(cache, expected, seed)


@pytest.mark.gpu
def test_kv_cache_write_gpu(gpu, device, seed):
    _check(
        device,
        seed,
        tokens=8192,
        n_kv=8,
        head_dim=128,
        block_size=16,
        num_blocks=1024,
        dtype=torch.bfloat16,
    )
