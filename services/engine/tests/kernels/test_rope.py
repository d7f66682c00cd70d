"""RoPE and Qwen3's q/k-norm + RoPE against the HF-ordered reference.

Tolerance: float32 ‖out − ref‖/‖ref‖ <= 1e-6 and max error <= 1e-5 of max|ref| (the
rotation's differences cancel, so no per-element ulp bound); bfloat16 rounds at HF's points
on both sides, so at most 1% of elements may differ (a last-bit flip of the float32 norm
statistics carries through), rel-L2 <= 2e-3, max error <= 1.6e-2 of max|ref|.
Out-of-place outputs are poisoned with NaN; in-place runs on a copy.

The launch that also stores K/V into the paged cache (``store=KVStore(...)``) must be
bit-identical to rope followed by ``kv_cache_write``: same q and k, same cache. Its cache
is poisoned with NaN so that a missing, misplaced or padding write shows.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl
from hopper_codegen import hopper_ptx_counts

from jacana_engine.kernels._row_sum_order import (
    HEAD_SUM_PAIRS,
    HEAD_SUM_QUADS,
    HEAD_SUM_TRITON,
    head_norm_order,
    head_sum_of_squares,
    torch_row_sum_order,
)
from jacana_engine.kernels.kv_cache_write import kv_cache_write
from jacana_engine.kernels.reference import (
    build_cos_sin_cache,
    qk_norm_rope_reference,
    rope_kv_store_reference,
    rope_reference,
    torch_cuda_row_sum_reference,
    transformers_rms_norm,
)
from jacana_engine.kernels.rope import (
    KVStore,
    qk_norm_order,
    qk_norm_rope,
    rope,
    rounded_product,
)


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


# ---------------------------------------------------------------- the q/k norm's sum order


def test_head_norm_order():
    """Which heads can follow torch's order from their rotary halves: whole powers of 2 up
    to 128, rotated over all of the head (16 to 64 strided, 128 four consecutive values a
    thread); and up to which size the kernels do (not at Qwen3's 128: speed)."""
    forms = {hd: head_norm_order(hd, hd) for hd in (16, 32, 48, 64, 96, 128, 256)}
    assert forms == {16: HEAD_SUM_PAIRS, 32: HEAD_SUM_PAIRS, 48: HEAD_SUM_TRITON,
                     64: HEAD_SUM_PAIRS, 96: HEAD_SUM_TRITON, 128: HEAD_SUM_QUADS,
                     256: HEAD_SUM_TRITON}  # fmt: skip
    assert head_norm_order(64, 32) == HEAD_SUM_TRITON  # partial rotation: a third part
    assert qk_norm_order(64, 64) == HEAD_SUM_PAIRS
    assert qk_norm_order(128, 128) == HEAD_SUM_TRITON


@triton.jit
def _head_sums_kernel(x_ptr, out_ptr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                      ORDER: tl.constexpr):  # fmt: skip
    h = tl.arange(0, BLOCK_H)[:, None]
    j = tl.arange(0, HALF)[None, :]
    x1 = tl.load(x_ptr + h * 2 * HALF + j).to(tl.float32)
    x2 = tl.load(x_ptr + h * 2 * HALF + HALF + j).to(tl.float32)
    tl.store(out_ptr + tl.arange(0, BLOCK_H), head_sum_of_squares(x1, x2, HALF, ORDER))


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128])
def test_head_sum_of_squares_in_torch_order(device, seed, head_dim):
    """The q/k norm's sum from the rotary halves has the bits of torch's order for rows of
    head_dim values at every row count (emulated), which the plain sum does not always
    have."""
    heads = 64
    x = (torch.randn(heads, head_dim, device=device) * 4).to(torch.bfloat16)
    got = torch.full((heads,), float("nan"), device=device)
    order = head_norm_order(head_dim, head_dim)
    _head_sums_kernel[(1,)](x, got, HALF=head_dim // 2, BLOCK_H=heads, ORDER=order)
    sq = x.float().pow(2)
    for rows in (1, 4, 8, 16, 64, 512):
        torch_order = torch_row_sum_order(head_dim, rows)
        want = torch_cuda_row_sum_reference(sq, torch_order.width, torch_order.vector)
        assert torch.equal(got, want), f"seed={seed} rows={rows}: {(got != want).sum()} differ"
    torch.manual_seed(0)
    many = (torch.randn(4096, head_dim) * 4).to(torch.bfloat16).float().pow(2)
    torch_order = torch_row_sum_order(head_dim, 1)
    emulated = torch_cuda_row_sum_reference(many, torch_order.width, torch_order.vector)
    assert (emulated != many.sum(-1)).any()


def test_head_sum_orders_compile_for_hopper():
    """Both of torch's orders build in the rope kernel compiled for sm90, not only under
    the CPU interpreter (a return inside a compile-time branch once let the quads fall
    through to the pairs' halving there), with no bf16 FMA."""
    counts = hopper_ptx_counts()
    for case in ("rope_qk_norm_pairs", "rope_qk_norm_quads"):
        assert counts[case]["fma.rn.bf16"] == 0, counts[case]


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 3, 17, 300])
def test_qk_norm_has_transformers_bits_at_head_dim_64_gpu(gpu, device, seed, tokens):
    """At head_dim 64 the q/k norm (in the rope kernel and folded into decode attention,
    which ``test_decode_rotation`` holds to the same bits) equals transformers' Qwen3 norm
    run by torch on the heads, bit for bit, and so does the rotation after it."""
    n_q, n_kv, head_dim, eps = 8, 2, 64, 1e-6
    q, k = _qkv(tokens, n_q, n_kv, head_dim, torch.bfloat16, device)
    q, k = q * 3, k * 3
    positions = torch.randint(0, 4096, (tokens,), device=device)
    cache = build_cos_sin_cache(_inv_freq(head_dim).to(device), 4096)
    qw = (1 + 0.2 * torch.randn(head_dim, device=device)).to(torch.bfloat16)
    kw = (1 + 0.2 * torch.randn(head_dim, device=device)).to(torch.bfloat16)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    qk_norm_rope(positions, q, k, qw, kw, eps, cache, q_out=q_out, k_out=k_out)
    for x, w, out, name in ((q, qw, q_out, "q"), (k, kw, k_out, "k")):
        # transformers normalizes the [B, T, heads, head_dim] view: one launch, all heads
        normed = transformers_rms_norm(x.reshape(-1, head_dim), w, eps).view_as(x)
        want = rope_reference(normed, positions, cache)
        assert torch.equal(out, want), f"seed={seed} {name}: {(out != want).sum()} differ"


# ---------------------------------------------------------------- rope + KV-cache store


def _same_cache(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Elementwise equality where NaN (the untouched poison) equals NaN."""
    return (out == ref) | (out.isnan() & ref.isnan())


def _check_store(
    device, seed, checks, *, tokens, n_q, n_kv, head_dim, rotary_dim, dtype, qk_norm, pad
):
    """Fused rope + store against the reference (q/k within the rope tolerance, cache
    exactly the kernel's own k and v) and bit for bit against rope then kv_cache_write."""
    block_size, num_blocks, max_pos = 4, -(-tokens // 4) + 2, 300
    qkv = torch.randn(tokens, (n_q + 2 * n_kv) * head_dim, device=device).to(dtype)
    q, k, v = qkv.split([n_q * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)
    q = q.view(tokens, n_q, head_dim)  # strided views of one projection, as in the model
    k = k.view(tokens, n_kv, head_dim)
    v = v.view(tokens, n_kv, head_dim)
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    cos_sin = build_cos_sin_cache(_inv_freq(rotary_dim).to(device), max_pos)
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]
    slots[torch.randperm(tokens, device=device)[:pad]] = -1  # padding rows store nothing
    shape = (2, num_blocks, block_size, n_kv, head_dim)
    cache = torch.full(shape, float("nan"), device=device).to(dtype)
    eps = 1e-6
    qw = kw = None
    if qk_norm:
        qw = (1 + 0.2 * torch.randn(head_dim, device=device)).to(dtype)
        kw = (1 + 0.2 * torch.randn(head_dim, device=device)).to(dtype)

    def launch(q_, k_, store=None):
        if qk_norm:
            return qk_norm_rope(positions, q_, k_, qw, kw, eps, cos_sin, store=store)
        return rope(positions, q_, k_, cos_sin, store=store)

    fused_qkv, fused_cache = qkv.clone(), cache.clone()
    fq, fk, fv = fused_qkv.split([n_q * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)
    fq, fk = fq.view_as(q), fk.view_as(k)
    launch(fq, fk, KVStore(fv.view_as(v), fused_cache, slots))
    # the unfused Triton path: rope in place, then the write kernel
    uq, uk, unfused_cache = q.clone(), k.clone(), cache.clone()
    launch(uq, uk)
    kv_cache_write(uk, v, unfused_cache, slots)

    what = f"rope+store norm={qk_norm} {dtype} rot={rotary_dim} seed={seed}"
    assert torch.equal(fq, uq) and torch.equal(fk, uk), f"{what}: q/k differ from rope"
    assert _same_cache(fused_cache, unfused_cache).all(), f"{what}: cache differs"
    assert torch.equal(fused_qkv[:, (n_q + n_kv) * head_dim :], qkv[:, (n_q + n_kv) * head_dim :])

    ref_q, ref_k, ref_cache = rope_kv_store_reference(
        q, k, v, positions, cos_sin, cache, slots, qw, kw, eps
    )
    for out, ref, name in ((fq, ref_q, "q"), (fk, ref_k, "k")):
        if dtype == torch.float32:
            checks.close(out, ref, rel_l2=1e-6, max_rel=1e-5, seed=seed, what=f"{what} {name}")
        else:
            checks.close(out, ref, rel_l2=2e-3, max_rel=1.6e-2, seed=seed, what=f"{what} {name}")
            checks.mostly_equal(out, ref, max_fraction=0.01, seed=seed, what=f"{what} {name}")
    # The cache holds exactly the kernel's rotated k and the given v at the real slots,
    # and nothing anywhere else (the padding rows' would-be slots stay poisoned too).
    expected_from_k = torch.full_like(cache, float("nan"))
    flat = expected_from_k.view(2, -1, n_kv, head_dim)
    real = slots >= 0
    flat[0, slots[real]] = fk[real]
    flat[1, slots[real]] = v[real]
    assert _same_cache(fused_cache, expected_from_k).all(), f"{what}: cache != stored k/v"
    assert (fused_cache.isnan() == ref_cache.isnan()).all(), f"{what}: slots written differ"


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (48, 32)])
def test_rope_store_matches_rope_then_write(device, seed, checks, qk_norm, head_dim, rotary_dim):
    dtypes = [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]
    for dtype in dtypes:
        _check_store(
            device,
            seed,
            checks,
            tokens=9,
            n_q=4,
            n_kv=2,
            head_dim=head_dim,
            rotary_dim=rotary_dim,
            dtype=dtype,
            qk_norm=qk_norm,
            pad=2,
        )


def test_rope_store_rejects_mismatched_cache(device):
    q = torch.randn(3, 4, 16, device=device)
    k = torch.randn(3, 2, 16, device=device)
    cos_sin = build_cos_sin_cache(_inv_freq(16).to(device), 8)
    positions = torch.arange(3, device=device)
    slots = torch.arange(3, device=device)
    cache = torch.zeros(2, 2, 4, 2, 16, device=device)
    with pytest.raises(ValueError, match="heads/head_dim"):
        rope(positions, q, k, cos_sin, store=KVStore(k, cache[..., :8], slots))
    with pytest.raises(ValueError, match="disagree"):
        rope(positions, q, k, cos_sin, store=KVStore(k[:2], cache, slots))
    with pytest.raises(ValueError, match="disagree"):
        rope(positions, q, k, cos_sin, store=KVStore(k, cache, slots[:2]))


@pytest.mark.gpu
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("batch", [1, 64])
def test_rope_store_gpu_qwen3_8b(gpu, device, seed, checks, qk_norm, batch):
    """Decode-step shapes of Qwen3-8B: one token per sequence, bf16."""
    _check_store(
        device,
        seed,
        checks,
        tokens=batch,
        n_q=32,
        n_kv=8,
        head_dim=128,
        rotary_dim=128,
        dtype=torch.bfloat16,
        qk_norm=qk_norm,
        pad=batch // 8,
    )


@triton.jit
def _bf16_products(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + i, mask=i < n, other=0.0)
    b = tl.load(b_ptr + i, mask=i < n, other=0.0)
    tl.store(out_ptr + i, rounded_product(a, b, tl.bfloat16), mask=i < n)


def test_rounded_product_rounds_to_nearest_even_like_torch(device, seed):
    """The rotation's products in bfloat16 are rounded on their bits (``rounded_product``):
    the same bits as torch's cast of the float32 product, ties to even included, over
    random and hand-picked operands (a tie, a carry into the exponent, overflow to inf,
    signed zeros)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(1000, generator=gen) * torch.exp(4 * torch.randn(1000, generator=gen))
    b = torch.randn(1000, generator=gen)
    tie = 1.0 + 2.0**-8  # halfway between two bf16 neighbours of 1: to even, 1.0
    hand_a = torch.tensor([tie, 1.0 + 3 * 2.0**-8, 2.0 - 2.0**-9, 3e38, 0.0, -0.0, -tie])
    hand_b = torch.tensor([1.0, 1.0, 1.0, 10.0, -1.0, 1.0, 1.0])
    a, b = torch.cat([a, hand_a]).to(device), torch.cat([b, hand_b]).to(device)
    out = torch.empty_like(a)
    _bf16_products[(1,)](a, b, out, a.numel(), BLOCK=triton.next_power_of_2(a.numel()))
    want = (a * b).to(torch.bfloat16).float()
    assert torch.equal(out.view(torch.int32), want.view(torch.int32)), f"seed={seed}"
