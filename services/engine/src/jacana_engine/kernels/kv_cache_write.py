"""Store one step's K/V into the paged cache.

The cache is owned by the model runner (one tensor per layer, on the model's device);
this kernel only writes the slots named by ``slot_mapping``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._common import check_kv_write, next_power_of_2


@triton.jit
def _kv_cache_write_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    num_kv_heads,
    head_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per token: all of its KV heads.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    # Padding tokens (slot < 0) mask every lane: the width drops to 0.
    mask = (heads < num_kv_heads) & (dims < tl.where(slot >= 0, head_dim, 0))
    k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    dst = block * stride_cache_block + offset * stride_cache_offset + heads * stride_cache_head
    tl.store(k_cache_ptr + dst + dims, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst + dims, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kv_cache_write(
    k: torch.Tensor,  # [T, n_kv, head_dim]
    v: torch.Tensor,  # [T, n_kv, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Write token t's K/V into flat slot ``slot_mapping[t]`` (``block * block_size +
    offset``) of ``kv_cache`` in place, cast to the cache's dtype. Negative slots
    (padding tokens) are skipped. Slots must be distinct; nothing is synchronized."""
    num_tokens, n_kv, head_dim = k.shape
    check_kv_write(k, v, kv_cache, slot_mapping)
    if num_tokens == 0:
        return
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _kv_cache_write_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        n_kv,
        head_dim,
        BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_H=next_power_of_2(n_kv),
        BLOCK_D=next_power_of_2(head_dim),
    )
