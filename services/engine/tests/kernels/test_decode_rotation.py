"""The rope kernel's work folded into the decode attention launch
(``paged_decode_attention(rotation=DecodeRotation(...))``): the same cache contents and
the same attention output as the rope kernel (with its K/V store) followed by the decode
kernel, on CPU under the interpreter and on the GPU at Qwen3-8B sizes."""

from __future__ import annotations

import pytest
import torch
from hopper_codegen import hopper_ptx_counts

from jacana_engine.kernels.decode_attention import paged_decode_attention
from jacana_engine.kernels.decode_rotation import DecodeRotation
from jacana_engine.kernels.reference import build_cos_sin_cache
from jacana_engine.kernels.rope import KVStore, qk_norm_rope, rope


def _cos_sin(rotary_dim: int, device) -> torch.Tensor:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    return build_cos_sin_cache(inv_freq.to(device), 4096)


def _both_ways(batch, q, k, v, table, norms, num_splits, padded=()):
    """(output, cache) the separate way and the folded way from the same inputs; the
    sequences in ``padded`` get length 0 and slot -1 (a padded graph row)."""
    seq_lens = batch.seq_lens_t.clone()
    slots = batch.slot_mapping.clone()
    for i in padded:
        seq_lens[i], slots[i] = 0, -1
    positions = (batch.seq_lens_t - 1).clamp(min=0).long()
    q_norm, k_norm = norms
    scale = q.shape[-1] ** -0.5
    results = []
    for folded in (False, True):
        cache = batch.kv_cache.clone()
        if folded:
            rotation = DecodeRotation(k, v, positions, table, slots, q_norm, k_norm, 1e-6)
            out = paged_decode_attention(
                q, cache, seq_lens, batch.block_tables, scale, num_splits=num_splits,
                rotation=rotation,
            )  # fmt: skip
        else:
            store = KVStore(v, cache, slots)
            q2, k2 = q.clone(), k.clone()
            if q_norm is None:
                rope(positions, q2, k2, table, store=store)
            else:
                qk_norm_rope(positions, q2, k2, q_norm, k_norm, 1e-6, table, store=store)
            out = paged_decode_attention(
                q2, cache, seq_lens, batch.block_tables, scale, num_splits=num_splits
            )
        results.append((out, cache))
    return results


@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
@pytest.mark.parametrize("rotary_dim", [32, 16], ids=["full", "partial"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_folded_rotation_equals_the_rope_kernel_then_attention(
    device, seed, paged_batch, qk_norm, rotary_dim, num_splits
):
    n_heads, n_kv, head_dim = 8, 2, 32
    seq_lens = [5, 17, 1, 40]
    batch = paged_batch([1] * len(seq_lens), seq_lens, block_size=4, n_kv=n_kv,
                        head_dim=head_dim, dtype=torch.float32, device=device)  # fmt: skip
    # q, k, v as strided views of one fused projection, as the model hands them over
    qkv = torch.randn(len(seq_lens), (n_heads + 2 * n_kv) * head_dim, device=device)
    q, k, v = qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], dim=1)
    q, k, v = (t.view(len(seq_lens), -1, head_dim) for t in (q, k, v))
    norms = (
        (
            1 + 0.1 * torch.randn(head_dim, device=device),
            1 + 0.1 * torch.randn(head_dim, device=device),
        )
        if qk_norm
        else (None, None)
    )
    table = _cos_sin(rotary_dim, device)
    (want, want_cache), (got, got_cache) = _both_ways(
        batch, q, k, v, table, norms, num_splits, padded=(2,)
    )
    assert torch.equal(got_cache, want_cache), f"seed={seed}"
    assert torch.equal(got, want), f"seed={seed}"
    assert not got[2].any(), "a padded row attends nothing"


@pytest.mark.parametrize("folded", [False, True], ids=["cache-written", "folded"])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_early_first_tile_keeps_the_bits(device, seed, paged_batch, folded, num_splits, dtype):
    """Each split's first KV tile loaded before the wait (what dependent launches do,
    ``early_tile``) against the plain loop: the same output and cache, bit for bit, with
    the step's token in a split's first tile and in a later one (140 tokens are 3 tiles
    of 64; one split walks them all), a padded row of no tokens, and one of three whose
    token is stored nowhere (a graph's padding: it attends what its slot held)."""
    n_heads, n_kv, head_dim = 8, 2, 32
    seq_lens = [5, 70, 140, 1, 3]
    batch = paged_batch([1] * len(seq_lens), seq_lens, block_size=16, n_kv=n_kv,
                        head_dim=head_dim, dtype=dtype, device=device)  # fmt: skip
    lens = batch.seq_lens_t.clone()
    slots = batch.slot_mapping.clone()
    lens[3], slots[3] = 0, -1
    slots[4] = -1
    q, k, v = (
        torch.randn(len(seq_lens), n, head_dim, device=device).to(dtype)
        for n in (n_heads, n_kv, n_kv)
    )
    norms = tuple((1 + 0.1 * torch.randn(head_dim, device=device)).to(dtype) for _ in range(2))
    positions = (batch.seq_lens_t - 1).clamp(min=0).long()
    table = _cos_sin(head_dim, device)
    results = []
    for early in (False, True):
        cache = batch.kv_cache.clone()
        rotation = None
        if folded:
            rotation = DecodeRotation(k, v, positions, table, slots, *norms, 1e-6)
        else:  # the step's K/V written first, as the cache-writing kernel would
            cache[0].view(-1, n_kv, head_dim)[slots[:3]] = k[:3]
            cache[1].view(-1, n_kv, head_dim)[slots[:3]] = v[:3]
        out = paged_decode_attention(
            q, cache, lens, batch.block_tables, head_dim**-0.5, num_splits=num_splits,
            rotation=rotation, early_tile=early,
        )  # fmt: skip
        results.append((out, cache))
    (want, want_cache), (got, got_cache) = results
    assert torch.equal(got_cache, want_cache), f"seed={seed}"
    assert torch.equal(got, want), f"seed={seed}"
    assert got[:3].abs().sum(-1).gt(0).all() and not got[3].any(), f"seed={seed}"
    assert got[4].abs().sum(-1).gt(0).all(), f"seed={seed}"


def test_a_rotation_must_fit_its_call(device):
    q = torch.randn(2, 4, 16, device=device)
    k = v = torch.randn(2, 2, 16, device=device)
    cache = torch.randn(2, 8, 4, 2, 16, device=device)
    tables = torch.zeros(2, 4, dtype=torch.int32, device=device)
    lens = torch.tensor([3, 5], dtype=torch.int32, device=device)
    slots = torch.tensor([2, 4], device=device)
    positions = torch.tensor([2, 4], device=device)
    table = _cos_sin(16, device)
    ok = DecodeRotation(k, v, positions, table, slots)
    with pytest.raises(ValueError, match="batch"):
        paged_decode_attention(
            q, cache, lens, tables, 0.25, rotation=ok._replace(positions=positions[:1])
        )
    with pytest.raises(ValueError, match="rotary_dim"):
        paged_decode_attention(
            q, cache, lens, tables, 0.25, rotation=ok._replace(cos_sin_cache=_cos_sin(32, device))
        )
    with pytest.raises(ValueError, match="together"):
        paged_decode_attention(
            q, cache, lens, tables, 0.25, rotation=ok._replace(q_norm=torch.ones(16, device=device))
        )


@pytest.mark.gpu
@pytest.mark.parametrize("batch_size", [1, 64])
def test_folded_rotation_at_qwen3_8b_sizes_gpu(gpu, device, seed, paged_batch, batch_size):
    """bf16, Qwen3-8B heads (q/k norm, full rotation), contexts of up to 1,000 tokens: the
    caches and outputs equal up to the q/k-norm statistics, which the two kernels may sum
    in another thread layout (a rotated element may then round to its neighbour)."""
    n_heads, n_kv, head_dim = 32, 8, 128
    gen = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, 1000, (batch_size,), generator=gen).tolist()
    batch = paged_batch([1] * batch_size, seq_lens, block_size=16, n_kv=n_kv,
                        head_dim=head_dim, dtype=torch.bfloat16, device=device)  # fmt: skip
    qkv = torch.randn(batch_size, (n_heads + 2 * n_kv) * head_dim, device=device).bfloat16()
    q, k, v = qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], dim=1)
    q, k, v = (t.view(batch_size, -1, head_dim) for t in (q, k, v))
    norms = tuple((1 + 0.1 * torch.randn(head_dim, device=device)).bfloat16() for _ in range(2))
    (want, want_cache), (got, got_cache) = _both_ways(
        batch, q, k, v, _cos_sin(head_dim, device), norms, num_splits=None
    )
    differ = (got_cache != want_cache).double().mean().item()
    assert differ <= 1e-3, f"{differ:.2%} of cache elements differ, seed={seed}"
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(9, 3, 64), (32, 8, 128)], ids=["smollm2", "qwen3-8b"])
@pytest.mark.parametrize("num_splits", [None, 4])
def test_folded_rotation_without_qk_norm_keeps_the_bits_gpu(
    gpu, device, seed, paged_batch, heads, num_splits
):
    """Without a q/k norm nothing is summed before the rotation, so the fold must give the
    rope kernel's bits exactly: bf16, batches of 1 and 64, contexts of up to 1,000 tokens,
    each split of a sequence rotating and storing the same token, five fresh draws (a
    split that read its cache before the token's K landed would show here). SmolLM2's
    engine parity moved with the fold on an H200; this tells the kernel from the rest."""
    n_heads, n_kv, head_dim = heads
    gen = torch.Generator().manual_seed(seed)
    table = _cos_sin(head_dim, device)
    for batch_size in (1, 64):
        for draw in range(5):
            seq_lens = torch.randint(1, 1000, (batch_size,), generator=gen).tolist()
            batch = paged_batch([1] * batch_size, seq_lens, block_size=16, n_kv=n_kv,
                                head_dim=head_dim, dtype=torch.bfloat16, device=device)  # fmt: skip
            width = (n_heads + 2 * n_kv) * head_dim
            qkv = torch.randn(batch_size, width, device=device).bfloat16()
            q, k, v = qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], dim=1)
            q, k, v = (t.view(batch_size, -1, head_dim) for t in (q, k, v))
            (want, want_cache), (got, got_cache) = _both_ways(
                batch, q, k, v, table, (None, None), num_splits=num_splits
            )
            what = f"batch {batch_size} draw {draw} seed={seed}"
            assert torch.equal(got_cache, want_cache), f"cache differs: {what}"
            assert torch.equal(got, want), f"output differs: {what}"


def test_the_folded_rotation_compiles_to_no_bf16_fma_for_hopper():
    """The folding attention kernel is compiled with FMA contraction, where a rotation
    that rounds its products with casts loses a rounding to a bf16 FMA (the cast case
    shows LLVM doing it); the rotation's products are rounded on their bits instead, so
    the kernel's sm90 PTX holds no bf16 FMA, with and without the q/k norm. Compiled for
    the GPU here, without one, in a process outside the CPU interpreter."""
    counts = {case: c["fma.rn.bf16"] for case, c in hopper_ptx_counts().items()}
    assert counts["cast_rounding"] >= 1, counts  # the hazard is real with this compiler
    assert counts["folded_rotation"] == counts["folded_rotation_qk_norm"] == 0, counts
