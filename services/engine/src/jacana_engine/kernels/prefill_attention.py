"""Causal attention over paged KV for variable-length query chunks.

Serves prefill, chunked prefill and prefix-cache hits: sequence i brings ``n_i`` new
queries whose K/V are already written to the cache (``kv_cache_write``), after a cached
prefix of ``seq_lens[i] - n_i`` tokens that the same block table points to. It also
handles decode rows (n_i = 1), so one launch can cover a mixed batch.

One program per (KV head, query tile). A tile packs BLOCK_Q query tokens of one sequence
times the GROUP query heads that share the KV head into BLOCK_M = BLOCK_Q * GROUP matrix
rows, so each K/V tile is loaded once for the whole group. Row r is token ``r // GROUP``
of the tile and head ``kv_head * GROUP + r % GROUP``. The KV loop stops at the tile's last
causal key.

Which (sequence, tile) a program takes comes from a tile table built on the host
(``attention_tiles.prefill_tiles``), not from a (sequence x tile) grid: a mixed step of
one long prompt beside 63 decode rows has 64 x cdiv(prompt, BLOCK_Q) grid cells of which all but
cdiv(prompt, BLOCK_Q) + 63 would exit at once, tens of thousands of empty programs a
layer. The table lists tiles last tile first: the GPU starts the programs with the most
keys to attend first, and the cheap early tiles fill in at the end of the launch instead
of a few heavy ones running on alone: in a 1024-token prefill of the 8B on an H200 the
kernel's 36 launches take ~1.6 ms in this order against ~2.0 ms in sequence order. A
table may end in padding entries (sequence -1, which exit at once): a captured graph's
table has room for any step its bucket holds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._common import (
    check_kv_cache,
    check_last_dim_contiguous,
    dot_precision,
    next_power_of_2,
    num_sms,
)
from jacana_engine.kernels._online_softmax import (
    follows_cudnn_tiles,
    initial_row_sum,
    normalized,
    online_softmax_step,
    row_sum,
)
from jacana_engine.kernels.attention_tiles import prefill_tiles

_LOG2E = 1.4426950408889634
# Tile shape and launch config: the fastest of six tried on an H200 at Qwen3-8B shapes in
# bf16 (4 x 2048 fresh tokens: 0.433 ms vs 0.438 for 64/64/4/2; 8 x 512 after a 4096-token
# prefix: 0.799 vs 0.881 ms).
_BLOCK_M = 128  # query rows (tokens x group heads) per program
_BLOCK_N = 32  # KV tokens per tile at head_dim > 64
# Where ``follows_cudnn_tiles`` (head_dim <= 64), cuDNN's tile for a prompt: 128 keys, in
# programs of at most 64 rows (a [128, 128] float32 score tile would spill at 4 warps), so
# 16 rows per warp as cuDNN has them.
_BLOCK_N_SMALL_HEADS = 128
_MAX_BLOCK_M_WIDE_TILE = 64
_NUM_WARPS = 4
_NUM_STAGES = 3
# A grid of fewer than _SMALL_GRID_WAVES programs per SM at _BLOCK_M takes half the rows
# per program, so more SMs share the causal work (same bits: a row's sums do not depend
# on the tile's other rows). On an H200 the 0.6B's 1024-token prefill (128 programs at
# 128 rows) takes 903 µs at 64 rows against 1,064 at 128; the 8B's (256) is even either
# way (~1.6 ms); four 2048-token prompts (2,048 programs) keep 128 (0.413 against
# 0.455 ms at 64).
_SMALL_GRID_BLOCK_M = 64
_SMALL_GRID_WAVES = 4


@triton.jit
def _attend_tile(
    q,  # [BLOCK_M, BLOCK_D]
    acc,  # [BLOCK_M, BLOCK_D] float32
    m_i,  # [BLOCK_M] float32, running max (log2 units)
    l_i,  # float32 running sum (initial_row_sum)
    start,
    kv_end,
    q_pos,  # [BLOCK_M]
    bt_row,
    k_cache_ptr,
    v_cache_ptr,
    head_off,
    stride_cache_block,
    stride_cache_offset,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    CAUSAL_EDGE: tl.constexpr,
    PRECISION: tl.constexpr,
    FRAGMENT_SUM: tl.constexpr,
):
    """One KV tile of the online softmax. Off the causal edge every key of the tile is
    in range and visible to every row, so neither bounds nor causal masks are applied."""
    n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
    d = tl.arange(0, BLOCK_D)
    if CAUSAL_EDGE:
        n_mask = n < kv_end
        block = tl.load(bt_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    else:
        block = tl.load(bt_row + n // BLOCK_SIZE).to(tl.int64)
    kv_off = block * stride_cache_block + (n % BLOCK_SIZE) * stride_cache_offset + head_off
    ptrs = kv_off[:, None] + d[None, :]
    # k, v: [BLOCK_N, BLOCK_D]
    if CAUSAL_EDGE:
        kv_mask = n_mask[:, None] & (d[None, :] < HEAD_DIM)
        k = tl.load(k_cache_ptr + ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + ptrs, mask=kv_mask, other=0.0)
    elif HEAD_DIM == BLOCK_D:
        k = tl.load(k_cache_ptr + ptrs)
        v = tl.load(v_cache_ptr + ptrs)
    else:
        k = tl.load(k_cache_ptr + ptrs, mask=d[None, :] < HEAD_DIM, other=0.0)
        v = tl.load(v_cache_ptr + ptrs, mask=d[None, :] < HEAD_DIM, other=0.0)
    # s: [BLOCK_M, BLOCK_N] in log2 units
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * scale_log2
    if CAUSAL_EDGE:
        # Key 0 is visible to every row and lies in the first tile, so m_i is finite
        # from then on; a row with no visible key in a later tile keeps alpha = 1, p = 0.
        s = tl.where((n[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
    m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, PRECISION, FRAGMENT_SUM)
    return acc, m_i, l_i


# The block table's width and the per-step metadata's addresses change from step to step;
# specializing on them (% 16, 16-byte alignment) compiled new binaries mid-serving, each
# stalling a step for ~1.5 s (research/compile_stability_gpu.py). They are scalar loads,
# so the hints buy nothing.
@triton.jit(do_not_specialize=["seq_lens_ptr", "block_tables_ptr", "tiles_ptr", "stride_bt"])
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    tiles_ptr,  # [programs, 2] int32: (sequence, query tile); sequence -1 = padding
    scale_log2,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    stride_bt,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
    FRAGMENT_SUM: tl.constexpr,  # the row sum in cuDNN's order (_online_softmax)
):
    kv_head = tl.program_id(0)
    entry = tiles_ptr + tl.program_id(1).to(tl.int64) * 2
    seq = tl.load(entry)
    if seq < 0:  # padding of a captured step's table
        return
    q_tile = tl.load(entry + 1)

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first = q_tile * BLOCK_Q  # first query (within the sequence) of this tile
    if first >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len  # cached prefix length

    r = tl.arange(0, BLOCK_M)
    tok = first + r // GROUP  # [BLOCK_M] query index within the sequence
    heads = kv_head * GROUP + r % GROUP
    row_mask = (r // GROUP < BLOCK_Q) & (tok < q_len)
    d = tl.arange(0, BLOCK_D)
    io_mask = row_mask[:, None] & (d[None, :] < HEAD_DIM)
    q_rows = (q_start + tok).to(tl.int64)
    # q: [BLOCK_M, BLOCK_D]
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=io_mask,
        other=0.0,
    )
    q_pos = context + tok  # [BLOCK_M] absolute position of each row's query

    last = tl.minimum(first + BLOCK_Q, q_len) - 1
    kv_end = context + last + 1  # keys past the tile's last query are never seen
    # Keys below context + first + 1 are visible to every row of the tile.
    open_end = (context + first + 1) // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = initial_row_sum(BLOCK_M, FRAGMENT_SUM)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_off = kv_head * stride_cache_head
    for start in range(0, open_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start, kv_end, q_pos, bt_row, k_cache_ptr, v_cache_ptr,
            head_off, stride_cache_block, stride_cache_offset, scale_log2,
            HEAD_DIM, BLOCK_N, BLOCK_D, BLOCK_SIZE, False, PRECISION, FRAGMENT_SUM,
        )  # fmt: skip
    for start in range(open_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start, kv_end, q_pos, bt_row, k_cache_ptr, v_cache_ptr,
            head_off, stride_cache_block, stride_cache_offset, scale_log2,
            HEAD_DIM, BLOCK_N, BLOCK_D, BLOCK_SIZE, True, PRECISION, FRAGMENT_SUM,
        )  # fmt: skip

    out = normalized(acc, row_sum(l_i, FRAGMENT_SUM))
    tl.store(
        out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=io_mask,
    )


def choose_block_m(batch: int, max_query_len: int, group: int, n_kv: int, sms: int) -> int:
    """Query rows per program: ``_BLOCK_M``, or ``_SMALL_GRID_BLOCK_M`` when a grid at
    ``_BLOCK_M`` would give the GPU's ``sms`` SMs fewer than ``_SMALL_GRID_WAVES``
    programs each (at least one group of query heads either way)."""
    block_m = max(_BLOCK_M, next_power_of_2(group))
    programs = batch * triton.cdiv(max_query_len, block_m // group) * n_kv
    if programs < _SMALL_GRID_WAVES * sms:
        block_m = max(_SMALL_GRID_BLOCK_M, next_power_of_2(group))
    return block_m


def prefill_block_m(
    batch: int, max_query_len: int, n_heads: int, n_kv: int, head_dim: int, sms: int
) -> int:
    """The query rows per program that a launch for ``batch`` sequences of at most
    ``max_query_len`` queries takes by default (``choose_block_m``, held to
    ``_MAX_BLOCK_M_WIDE_TILE`` where the KV tile is cuDNN's wide one)."""
    group = n_heads // n_kv
    block_m = choose_block_m(batch, max_query_len, group, n_kv, sms)
    if follows_cudnn_tiles(head_dim):
        block_m = max(min(block_m, _MAX_BLOCK_M_WIDE_TILE), next_power_of_2(group))
    return block_m


def paged_prefill_attention(
    q: torch.Tensor,  # [T, n_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
    query_start_loc: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32, cached prefix + new tokens
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    scale: float,
    *,
    max_query_len: int,
    out: torch.Tensor | None = None,  # [T, n_heads, head_dim]
    block_m: int | None = None,
    tiles: torch.Tensor | None = None,  # [programs, 2] int32 on q's device
) -> torch.Tensor:  # [T, n_heads, head_dim] in q's dtype (or out's)
    """Causal attention of each sequence's new queries over its cached prefix and
    themselves, all read from the paged cache (so the new K/V must be written first).
    ``max_query_len`` is a host-side upper bound on ``qsl[i+1] - qsl[i]`` (from
    ``query_lens_cpu``). ``block_m``: query rows per program, a power of two at least
    the query-head group (default: ``prefill_block_m``). ``tiles``: the launch's tile
    table (``prefill_tiles`` at ``block_m // group``; needs ``block_m``); without it the
    table is built from ``query_start_loc``, which reads it on the host (a sync on a
    GPU: the engine passes its own). Rows of ``out`` not covered by any sequence are
    left untouched."""
    num_tokens, n_heads, head_dim = q.shape
    n_kv = kv_cache.shape[3]
    check_kv_cache(kv_cache, n_kv, head_dim)
    if n_heads % n_kv != 0:
        raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv}")
    batch = seq_lens.shape[0]
    if query_start_loc.shape != (batch + 1,) or block_tables.shape[0] != batch:
        raise ValueError("query_start_loc / block_tables do not match seq_lens' batch")
    check_last_dim_contiguous("q", q)
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous along its rows")
    out = torch.empty_like(q) if out is None else out
    check_last_dim_contiguous("out", out)
    if batch == 0 or num_tokens == 0 or max_query_len <= 0:
        return out

    group = n_heads // n_kv
    block_n = _BLOCK_N_SMALL_HEADS if follows_cudnn_tiles(head_dim) else _BLOCK_N
    if block_m is None:
        if tiles is not None:
            raise ValueError("a tile table is built for a block_m: pass it too")
        block_m = prefill_block_m(batch, max_query_len, n_heads, n_kv, head_dim, num_sms(q.device))
    elif block_m < group or block_m & (block_m - 1):
        raise ValueError(f"block_m {block_m} is not a power of two >= the group {group}")
    block_q = block_m // group
    if tiles is None:
        lens = query_start_loc.diff().tolist()
        tiles = torch.from_numpy(prefill_tiles(lens, block_q)).to(q.device)
    if tiles.dtype != torch.int32 or tiles.dim() != 2 or tiles.shape[1] != 2:
        shape = tuple(tiles.shape)
        raise ValueError(f"tiles must be [programs, 2] int32, got {shape} {tiles.dtype}")
    if tiles.shape[0] == 0:
        return out
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    grid = (n_kv, tiles.shape[0])
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        query_start_loc,
        seq_lens,
        block_tables,
        tiles,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        HEAD_DIM=head_dim,
        GROUP=group,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=next_power_of_2(head_dim),
        BLOCK_SIZE=kv_cache.shape[2],
        PRECISION=dot_precision(q.dtype),
        FRAGMENT_SUM=follows_cudnn_tiles(head_dim),
        num_warps=_NUM_WARPS,
        num_stages=_NUM_STAGES,
    )
    return out
