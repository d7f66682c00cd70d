"""Paged decode attention: one query token per sequence, split-K over the KV length.

Stage 1 runs one program per (sequence, KV head, split). The program serves every query
head of its KV head's group at once (GQA: K/V are read once per group) and walks its
share of the sequence's KV tiles through the block table, keeping an online softmax.
With one split it writes the output directly; otherwise it writes an unnormalized
partial (accumulator, running max, running sum) and stage 2 merges the splits with
log-sum-exp weights. The split count is fixed per launch while each sequence divides
its own length into that many ranges on the device, so a launch needs no host sync and
has the same grid every step (CUDA-graph friendly).

Partials are float32 scratch allocated per call; the caller owns the output and cache.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._common import (
    check_kv_cache,
    check_last_dim_contiguous,
    dot_precision,
    next_power_of_2,
)

_LOG2E = 1.4426950408889634
_BLOCK_N = 64  # KV tokens per tile
_MIN_BLOCK_G = 16  # tl.dot needs >= 16 rows: small GQA groups are padded
_MAX_SPLITS = 64


@triton.jit
def _decode_partial_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    stride_bt,
    num_heads,
    head_dim,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g  # [BLOCK_G]
    g_mask = g < GROUP
    d_mask = d < head_dim
    # q: [BLOCK_G, BLOCK_D]; padded rows are zeros (their results are never stored)
    q = tl.load(
        q_ptr + seq.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_off = kv_head * stride_cache_head
    for tile in range(tile_lo, tile_hi):
        n = tile * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] token positions
        n_mask = n < seq_len
        block = tl.load(bt_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        kv_off = block * stride_cache_block + (n % BLOCK_SIZE) * stride_cache_offset + head_off
        kv_mask = n_mask[:, None] & d_mask[None, :]
        # k, v: [BLOCK_N, BLOCK_D]
        k = tl.load(k_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        # s: [BLOCK_G, BLOCK_N], in log2 units
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * scale_log2
        s = tl.where(n_mask[None, :], s, float("-inf"))
        # Every tile holds >= 1 valid key, so m_new is finite and alpha is well defined.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(
            p.to(v.dtype), v, input_precision=PRECISION, out_dtype=tl.float32
        )
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + seq.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=g_mask[:, None] & d_mask[None, :],
        )
    else:
        # partials: acc [B, H, S, D], max/sum [B, H, S]; an empty split stores (0, -inf, 0)
        row = (seq.to(tl.int64) * num_heads + heads) * NUM_SPLITS + split  # [BLOCK_G]
        tl.store(part_acc_ptr + row[:, None] * BLOCK_D + d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_max_ptr + row, m_i, mask=g_mask)
        tl.store(part_sum_ptr + row, l_i, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    stride_ob,
    stride_oh,
    num_heads,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < NUM_SPLITS
    row = (seq.to(tl.int64) * num_heads + head) * NUM_SPLITS + s  # [BLOCK_S]
    m = tl.load(part_max_ptr + row, mask=s_mask, other=float("-inf"))
    sums = tl.load(part_sum_ptr + row, mask=s_mask, other=0.0)
    m_all = tl.max(m, axis=0)  # finite: split 0 always holds the first tile
    w = tl.exp2(m - m_all)  # empty or padded splits weigh 0
    acc = tl.load(
        part_acc_ptr + row[:, None] * BLOCK_D + d[None, :], mask=s_mask[:, None], other=0.0
    )
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(sums * w, axis=0)  # [BLOCK_D]
    tl.store(
        out_ptr + seq.to(tl.int64) * stride_ob + head * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d < head_dim,
    )


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(
    batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device | str
) -> int:
    """Splits per sequence so that about two programs per SM are in flight, without
    giving a split fewer than two tiles of the longest sequence. Host-only arithmetic.
    (On an H200 at batch 64 x 8 KV heads, one split already streams the cache at ~4.4
    TB/s; more only add the merge.)"""
    programs = max(1, batch * num_kv_heads)
    want = -(-2 * _num_sms(torch.device(device)) // programs)
    by_length = max(1, -(-max_seq_len // _BLOCK_N) // 2)
    return max(1, min(want, by_length, _MAX_SPLITS))


def paged_decode_attention(
    q: torch.Tensor,  # [B, n_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
    seq_lens: torch.Tensor,  # [B] int32, >= 1, including this step's token
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    scale: float,
    *,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,  # [B, n_heads, head_dim]
) -> torch.Tensor:  # [B, n_heads, head_dim] in q's dtype (or out's)
    """Attention of each sequence's single query over its whole paged KV (causality is
    implicit: the query is the last position). The token's own K/V must already be in
    the cache (``kv_cache_write``). ``num_splits`` fixes the split-K factor; by default it
    is chosen from ``max_seq_len`` (a host-side bound, e.g. from ``seq_lens_cpu``; the
    cache's capacity per sequence when omitted). No host sync."""
    batch, n_heads, head_dim = q.shape
    n_kv = kv_cache.shape[3]
    check_kv_cache(kv_cache, n_kv, head_dim)
    if n_heads % n_kv != 0:
        raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv}")
    if seq_lens.shape != (batch,) or block_tables.shape[0] != batch:
        raise ValueError("seq_lens / block_tables do not match q's batch")
    check_last_dim_contiguous("q", q)
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous along its rows")
    out = torch.empty_like(q) if out is None else out
    check_last_dim_contiguous("out", out)
    if batch == 0:
        return out

    block_size = kv_cache.shape[2]
    group = n_heads // n_kv
    if num_splits is None:
        bound = max_seq_len if max_seq_len is not None else block_tables.shape[1] * block_size
        num_splits = choose_num_splits(batch, n_kv, bound, q.device)
    if not 1 <= num_splits <= 256:
        raise ValueError(f"num_splits must be in [1, 256], got {num_splits}")
    block_d = next_power_of_2(head_dim)
    block_g = max(_MIN_BLOCK_G, next_power_of_2(group))
    if num_splits > 1:
        part_acc = torch.empty(
            batch, n_heads, num_splits, block_d, dtype=torch.float32, device=q.device
        )
        part_max = torch.empty(batch, n_heads, num_splits, dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_acc = part_max = part_sum = out  # unused
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _decode_partial_kernel[(batch, n_kv, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_acc,
        part_max,
        part_sum,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        n_heads,
        head_dim,
        GROUP=group,
        BLOCK_G=block_g,
        BLOCK_N=_BLOCK_N,
        BLOCK_D=block_d,
        BLOCK_SIZE=block_size,
        NUM_SPLITS=num_splits,
        PRECISION=dot_precision(q.dtype),
        num_warps=4,
        num_stages=2,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(batch, n_heads)](
            out,
            part_acc,
            part_max,
            part_sum,
            out.stride(0),
            out.stride(1),
            n_heads,
            head_dim,
            NUM_SPLITS=num_splits,
            BLOCK_S=next_power_of_2(num_splits),
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out
