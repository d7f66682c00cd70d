"""Rotary position embedding (HF "rotate half" layout) for q and k, one program per token.

``cos_sin_cache`` [max_positions, rotary_dim] float32 holds ``cos(p * inv_freq)`` in its
first half and ``sin(p * inv_freq)`` in its second (``reference.build_cos_sin_cache``
builds it with HF's angles; scaling variants only change ``inv_freq`` or a factor folded
into the table). Dims past ``rotary_dim`` pass through. The Qwen3 variant first applies an
RMSNorm over each head's ``head_dim`` with a shared weight [head_dim].

Rounding follows HF in the activation dtype: cos/sin are cast to it, each product is
rounded, then the sum; the q/k norm rounds like ``rms_norm``. An FMA would skip the
product's rounding, so the kernel is compiled without floating-point contraction, and in
bfloat16 each product is rounded with integer arithmetic (``rounded_product``), which no
compiler fuses: decode attention folds this rotation into a kernel compiled with
contraction on, where with casts LLVM narrowed the products to bf16 multiplies and fused
them into the sums (``fma.rn.bf16`` in its sm90 PTX; its K then differed from this
kernel's on an H200). ``test_decode_rotation`` compiles it for sm90 to check. Works in
place (the default) or into given output tensors; q and k may be strided views of a fused
QKV projection.

Given ``store=KVStore(v, kv_cache, slot_mapping)``, the same launch also stores the
rotated k and the unrotated v at the tokens' slots, exactly as ``kv_cache_write`` would
after it: that saves one launch per layer and step. The k stored is the value rounded to
k's dtype (the one written to ``k_out``), then cast to the cache's dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._common import (
    check_kv_write,
    check_last_dim_contiguous,
    next_power_of_2,
)
from jacana_engine.kernels._pdl import pdl_launch, wait_for_previous_kernel
from jacana_engine.kernels._row_sum_order import (
    HEAD_SUM_TRITON,
    head_norm_order,
    head_sum_of_squares,
    unfused,
)
from jacana_engine.kernels.rmsnorm import rms_scale

# The q/k norm follows torch's order (``_row_sum_order.head_norm_order``) up to this head
# size. Above it (Qwen3's 128) the decode attention kernel that folds the norm in is at
# its register ceiling, and the order's tile cost the 8B ~0.3 ms a step (twentieth GPU run).
_TORCH_ORDER_MAX_HEAD_DIM = 64


def qk_norm_order(head_dim: int, rotary_dim: int) -> int:
    """The ``NORM_ORDER`` constexpr of ``rope_heads`` for this head: the same in every
    kernel that runs it (the rope kernel, decode attention's fold), so they agree bit for
    bit."""
    if head_dim > _TORCH_ORDER_MAX_HEAD_DIM:
        return HEAD_SUM_TRITON
    return head_norm_order(head_dim, rotary_dim)


@triton.jit
def rounded_product(a, b, dtype: tl.constexpr):
    """``a * b`` of float32 blocks rounded to ``dtype``, returned in float32. For
    bfloat16 the rounding (to nearest, ties to even) is done on the bits: a cast would let
    LLVM narrow the product to a bf16 multiply and, where contraction is on, fuse it with
    the add that follows. It also rounds to nearest under the CPU interpreter, whose cast
    truncates."""
    p = a * b
    if dtype == tl.bfloat16:
        bits = p.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.to(tl.float32, bitcast=True)
    else:
        return p.to(dtype).to(tl.float32)


@triton.jit
def rope_heads(
    x_ptr,
    out_ptr,
    norm_w_ptr,
    cache_ptr,  # this token's slot row [n_kv, head_dim] of the K cache (STORE_CACHE only)
    token,
    stride_xt,
    stride_xh,
    stride_ot,
    stride_oh,
    stride_ch,
    num_heads,
    cache_heads,  # heads to store in the cache: num_heads, or 0 for a padding token
    cos,  # [1, BLOCK_HALF] float32, already rounded to the activation dtype
    sin,
    eps,
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    HAS_NORM: tl.constexpr,
    STORE_CACHE: tl.constexpr,
    NORM_ORDER: tl.constexpr,  # with HAS_NORM: qk_norm_order(HEAD_DIM, 2 * HALF)
):
    h = tl.arange(0, BLOCK_H)[:, None]
    j = tl.arange(0, BLOCK_HALF)[None, :]
    rot_mask = (h < num_heads) & (j < HALF)
    src = x_ptr + token * stride_xt + h * stride_xh
    dst = out_ptr + token * stride_ot + h * stride_oh
    # x1, x2: [BLOCK_H, BLOCK_HALF], the two rotated halves
    x1 = tl.load(src + j, mask=rot_mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + j, mask=rot_mask, other=0.0).to(tl.float32)
    if BLOCK_PASS > 0:
        p = tl.arange(0, BLOCK_PASS)[None, :]
        pass_mask = (h < num_heads) & (p < HEAD_DIM - 2 * HALF)
        xp = tl.load(src + 2 * HALF + p, mask=pass_mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        if NORM_ORDER == 0:  # HEAD_SUM_TRITON
            sq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
            if BLOCK_PASS > 0:
                sq += tl.sum(xp * xp, axis=1)
            rstd = tl.rsqrt(sq / HEAD_DIM + eps)[:, None]  # [BLOCK_H, 1]
        else:  # torch's order; HEAD_DIM a power of 2, so 1 / HEAD_DIM is exact
            sq = head_sum_of_squares(x1, x2, HALF, NORM_ORDER)  # [BLOCK_H]
            rstd = tl.rsqrt(unfused(sq * (1.0 / HEAD_DIM)) + eps)[:, None]
        w1 = tl.load(norm_w_ptr + j, mask=j < HALF, other=0.0).to(tl.float32)
        w2 = tl.load(norm_w_ptr + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
        odt = out_ptr.dtype.element_ty
        x1 = rms_scale(x1, rstd, w1, odt).to(tl.float32)
        x2 = rms_scale(x2, rstd, w2, odt).to(tl.float32)
        if BLOCK_PASS > 0:
            wp = tl.load(norm_w_ptr + 2 * HALF + p, mask=p < HEAD_DIM - 2 * HALF, other=0.0)
            # rounded here once more than before the store: the same value
            xp = rms_scale(xp, rstd, wp.to(tl.float32), odt).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    o1 = rounded_product(x1, cos, dtype) - rounded_product(x2, sin, dtype)
    o2 = rounded_product(x2, cos, dtype) + rounded_product(x1, sin, dtype)
    tl.store(dst + j, o1.to(dtype), mask=rot_mask)
    tl.store(dst + HALF + j, o2.to(dtype), mask=rot_mask)
    if BLOCK_PASS > 0:
        tl.store(dst + 2 * HALF + p, xp.to(dtype), mask=pass_mask)
    if STORE_CACHE:
        # The values just stored, cast on from x's dtype: what kv_cache_write would copy.
        cdt = cache_ptr.dtype.element_ty
        cdst = cache_ptr + h * stride_ch
        cache_mask = (h < cache_heads) & (j < HALF)
        tl.store(cdst + j, o1.to(dtype).to(cdt), mask=cache_mask)
        tl.store(cdst + HALF + j, o2.to(dtype).to(cdt), mask=cache_mask)
        if BLOCK_PASS > 0:
            cache_pass_mask = (h < cache_heads) & (p < HEAD_DIM - 2 * HALF)
            tl.store(cdst + 2 * HALF + p, xp.to(dtype).to(cdt), mask=cache_pass_mask)


@triton.jit
def token_cos_sin(
    positions_ptr, cos_sin_ptr, stride_cs, token, dtype: tl.constexpr,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    """(cos, sin) [1, BLOCK_HALF] float32 at ``token``'s position, rounded to ``dtype``
    as HF rounds them."""
    pos = tl.load(positions_ptr + token).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_sin_ptr + pos * stride_cs + j, mask=j < HALF, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + j, mask=j < HALF, other=0.0)
    return cos.to(dtype).to(tl.float32), sin.to(dtype).to(tl.float32)


@triton.jit
def token_slot(
    slot_ptr, token, num_kv_heads, stride_cache_block, stride_cache_offset,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """(heads to store, offset of the token's slot in one of the paged caches): padding
    tokens (slot < 0) store nothing, their head count drops to 0."""
    slot = tl.load(slot_ptr + token).to(tl.int64)
    cache_heads = tl.where(slot >= 0, num_kv_heads, 0)
    slot_row = (slot // BLOCK_SIZE) * stride_cache_block + (slot % BLOCK_SIZE) * stride_cache_offset
    return cache_heads, slot_row


@triton.jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    q_norm_ptr,
    k_norm_ptr,
    positions_ptr,
    cos_sin_ptr,
    v_ptr,  # the rest: STORE_KV only
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    stride_cs,
    stride_vt,
    stride_vh,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    num_q_heads,
    num_kv_heads,
    eps,
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    HAS_NORM: tl.constexpr,
    NORM_ORDER: tl.constexpr,
    STORE_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # KV cache block size (STORE_KV only)
    BLOCK_D: tl.constexpr,  # next power of 2 of HEAD_DIM (STORE_KV only)
    PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    wait_for_previous_kernel(PDL)
    cos, sin = token_cos_sin(
        positions_ptr, cos_sin_ptr, stride_cs, token, q_out_ptr.dtype.element_ty, HALF, BLOCK_HALF
    )
    if STORE_KV:
        cache_heads, slot_row = token_slot(
            slot_ptr, token, num_kv_heads, stride_cache_block, stride_cache_offset, BLOCK_SIZE
        )
    else:
        cache_heads = 0
        slot_row = 0
    rope_heads(
        q_ptr,
        q_out_ptr,
        q_norm_ptr,
        q_out_ptr,  # no cache for q
        token,
        stride_qt,
        stride_qh,
        stride_qot,
        stride_qoh,
        0,
        num_q_heads,
        0,
        cos,
        sin,
        eps,
        HALF,
        HEAD_DIM,
        BLOCK_HQ,
        BLOCK_HALF,
        BLOCK_PASS,
        HAS_NORM,
        False,
        NORM_ORDER,
    )
    rope_heads(
        k_ptr,
        k_out_ptr,
        k_norm_ptr,
        k_cache_ptr + slot_row,
        token,
        stride_kt,
        stride_kh,
        stride_kot,
        stride_koh,
        stride_cache_head,
        num_kv_heads,
        cache_heads,
        cos,
        sin,
        eps,
        HALF,
        HEAD_DIM,
        BLOCK_HK,
        BLOCK_HALF,
        BLOCK_PASS,
        HAS_NORM,
        STORE_KV,
        NORM_ORDER,
    )
    if STORE_KV:
        # v is copied as is: [BLOCK_HK, BLOCK_D] per token
        h = tl.arange(0, BLOCK_HK)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        v_mask = (h < cache_heads) & (d < HEAD_DIM)
        v = tl.load(v_ptr + token * stride_vt + h * stride_vh + d, mask=v_mask)
        v_dst = v_cache_ptr + slot_row + h * stride_cache_head + d
        tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=v_mask)


class KVStore(NamedTuple):
    """This step's V and where to store K/V: ``kv_cache_write``'s arguments, for a rope
    launch that also fills the paged cache. Slots must be distinct; negative ones
    (padding tokens) are skipped."""

    v: torch.Tensor  # [T, n_kv, head_dim], stored unrotated
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, n_kv, head_dim]
    slot_mapping: torch.Tensor  # [T] int64, block * block_size + offset; < 0 = padding


def _rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    q_out: torch.Tensor | None,
    k_out: torch.Tensor | None,
    store: KVStore | None,
    pdl: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, n_q, head_dim = q.shape
    n_kv = k.shape[1]
    rotary_dim = cos_sin_cache.shape[1]
    if k.shape != (num_tokens, n_kv, head_dim) or positions.shape != (num_tokens,):
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, positions {tuple(positions.shape)} disagree"
        )
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and <= head_dim {head_dim}")
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.stride(1) != 1:
        raise ValueError("cos_sin_cache must be float32 with unit stride on its last dimension")
    check_last_dim_contiguous("q", q)
    check_last_dim_contiguous("k", k)
    q_out = q if q_out is None else q_out
    k_out = k if k_out is None else k_out
    if q_out.shape != q.shape or k_out.shape != k.shape:
        raise ValueError("q_out / k_out must have the shapes of q / k")
    check_last_dim_contiguous("q_out", q_out)
    check_last_dim_contiguous("k_out", k_out)
    if store is not None:
        check_kv_write(k, store.v, store.kv_cache, store.slot_mapping)
    if num_tokens == 0:
        return q_out, k_out
    has_norm = q_weight is not None
    if has_norm and (q_weight.shape != (head_dim,) or k_weight.shape != (head_dim,)):
        raise ValueError(f"q/k norm weights must be [{head_dim}]")
    pass_dim = head_dim - rotary_dim
    if store is not None:
        v, k_cache, v_cache = store.v, store.kv_cache[0], store.kv_cache[1]
        slots, block_size = store.slot_mapping, store.kv_cache.shape[2]
        store_strides = (v.stride(0), v.stride(1), *k_cache.stride()[:3])
    else:  # the kernel reads none of these: any tensors will do
        v, k_cache, v_cache, slots, block_size = k, k_out, k_out, positions, 1
        store_strides = (0,) * 5
    _rope_kernel[(num_tokens,)](
        q,
        k,
        q_out,
        k_out,
        q_weight if has_norm else q,
        k_weight if has_norm else k,
        positions,
        cos_sin_cache,
        v,
        k_cache,
        v_cache,
        slots,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        q_out.stride(0),
        q_out.stride(1),
        k_out.stride(0),
        k_out.stride(1),
        cos_sin_cache.stride(0),
        *store_strides,
        n_q,
        n_kv,
        eps,
        HALF=rotary_dim // 2,
        HEAD_DIM=head_dim,
        BLOCK_HQ=next_power_of_2(n_q),
        BLOCK_HK=next_power_of_2(n_kv),
        BLOCK_HALF=next_power_of_2(rotary_dim // 2),
        BLOCK_PASS=next_power_of_2(pass_dim) if pass_dim else 0,
        HAS_NORM=has_norm,
        NORM_ORDER=qk_norm_order(head_dim, rotary_dim) if has_norm else HEAD_SUM_TRITON,
        STORE_KV=store is not None,
        BLOCK_SIZE=block_size,
        BLOCK_D=next_power_of_2(head_dim),
        num_warps=4,
        enable_fp_fusion=False,
        **pdl_launch(pdl, q.device),
    )
    return q_out, k_out


def rope(
    positions: torch.Tensor,  # [T] int
    q: torch.Tensor,  # [T, n_heads, head_dim]
    k: torch.Tensor,  # [T, n_kv, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_positions, rotary_dim] float32
    *,
    q_out: torch.Tensor | None = None,  # [T, n_heads, head_dim]; None = in place
    k_out: torch.Tensor | None = None,  # [T, n_kv, head_dim]; None = in place
    store: KVStore | None = None,  # also store rotated k and v into the paged cache
    pdl: bool = False,  # launch with programmatic dependent launch (kernels/_pdl.py)
) -> tuple[torch.Tensor, torch.Tensor]:  # (q_out, k_out)
    """Rotate q and k by their tokens' positions. Positions must index the table."""
    return _rope(positions, q, k, cos_sin_cache, None, None, 0.0, q_out, k_out, store, pdl)


def qk_norm_rope(
    positions: torch.Tensor,  # [T] int
    q: torch.Tensor,  # [T, n_heads, head_dim]
    k: torch.Tensor,  # [T, n_kv, head_dim]
    q_weight: torch.Tensor,  # [head_dim]
    k_weight: torch.Tensor,  # [head_dim]
    eps: float,
    cos_sin_cache: torch.Tensor,  # [max_positions, rotary_dim] float32
    *,
    q_out: torch.Tensor | None = None,  # [T, n_heads, head_dim]; None = in place
    k_out: torch.Tensor | None = None,  # [T, n_kv, head_dim]; None = in place
    store: KVStore | None = None,  # also store rotated k and v into the paged cache
    pdl: bool = False,  # launch with programmatic dependent launch (kernels/_pdl.py)
) -> tuple[torch.Tensor, torch.Tensor]:  # (q_out, k_out)
    """Qwen3: RMSNorm each head of q (weight ``q_weight``) and k (``k_weight``) over
    ``head_dim``, then rotate, in one pass."""
    if k_weight is None or q_weight is None:
        raise ValueError("qk_norm_rope needs both q_weight and k_weight")
    return _rope(positions, q, k, cos_sin_cache, q_weight, k_weight, eps, q_out, k_out, store, pdl)
