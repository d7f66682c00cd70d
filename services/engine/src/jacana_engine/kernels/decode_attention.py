"""Paged decode attention: one query token per sequence, split-K over the KV length.

Stage 1 runs one program per (sequence, KV head, split). The program serves every query
head of its KV head's group at once (GQA: K/V are read once per group) and walks its
share of the sequence's KV tiles through the block table, keeping an online softmax.
With one split it writes the output directly; otherwise it writes an unnormalized
partial (accumulator, running max, running sum) and the splits are merged with
log-sum-exp weights (``decode_merge.py``). The split count is fixed per launch while each
sequence divides its own length into that many ranges on the device, so a launch needs
no host sync and has the same grid every step (CUDA-graph friendly).

Numerics: a split takes at least ``min_split_tiles`` tiles (1 by default). cuDNN's
attention adds a sequence in one pass, and a merge of per-split partials rounds
differently, so where the kernels follow cuDNN's numerics (``_online_softmax``)
``cudnn_min_split_tiles`` (4) gives its bits up to 256 keys whatever a graph's split
count; the engine asks for that by default (``exact_decode_attention``), at the cost of
serial tiles on short sequences.

The merge runs by default in the same launch ("last program merges"): each stage-1
program bumps a per-(sequence, KV head) arrival counter after storing its partial, and
the program that arrives last merges its group's heads and resets the counter to 0,
which saves a second launch. The counters are persistent int32 device buffers
(``kernels/_arrivals.py``, never freed: captured graphs hold their address); launches
that share a device must be stream-ordered, not concurrent. ``fused_merge=False`` runs
the same merge in a second kernel instead.

With programmatic dependent launch a program lets the next kernel launch at once, then
reads what no kernel of the step's chain writes (the host-staged lengths, block table,
positions and slots, and the first KV tile of its split without the step's own token:
``early_tile``) while the kernel before it still runs, and only then waits for it.
The token's own row (stored by this launch's rotation, or by the kernel before) is read
after the wait. Why the rest is safe to read early: a dependent chain may run ahead of
itself (a kernel can start while several before it still wait), but it starts behind a
plain launch (the step's embedding lookup), which began only once every earlier kernel,
those of earlier steps included, had finished; within the chain no kernel but this one
writes this layer's cache, and none writes the step's host-staged inputs. The results
are the same bits either way.

With ``rotation`` the launch first does the rope kernel's work (``decode_rotation.py``).
Partials are float32 scratch allocated per call; the caller owns the output and cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._arrivals import arrival_counters
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
from jacana_engine.kernels._pdl import (
    let_next_kernel_launch,
    pdl_launch,
    wait_only_for_previous_kernel,
)
from jacana_engine.kernels.decode_merge import MERGE_TILE, decode_reduce_kernel, merge_group
from jacana_engine.kernels.decode_rotation import (
    NO_ROPE_META,
    DecodeRotation,
    rope_launch_args,
    rotate_and_store,
    rotation_tensors,
)
from jacana_engine.kernels.rope import token_cos_sin, token_slot

_LOG2E = 1.4426950408889634
COUNTERS = "decode_attention"  # this kernel's family of arrival counters (kernels/_arrivals.py)
_BLOCK_N = 64  # KV tokens per tile (cuDNN's for one query: ``_online_softmax``)
_MIN_BLOCK_G = 16  # tl.dot needs >= 16 rows: small GQA groups are padded
_MAX_SPLITS = 64
_NUM_WARPS = 4  # warps a program of the decode kernel (and of its unfused merge)
_NUM_STAGES = 2  # software-pipeline stages of the decode kernel's KV tile loop


@triton.jit
def _kv_tile(
    k_cache_ptr, v_cache_ptr, bt_row, tile, seq_len, head_off, stride_cache_block,
    stride_cache_offset, upto, d, d_mask, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """(k, v [BLOCK_N, BLOCK_D], offsets [BLOCK_N], positions [BLOCK_N]) of KV tile
    ``tile`` of a sequence of ``seq_len`` tokens through its block-table row; rows at
    positions >= ``upto`` load as zeros."""
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] token positions
    block = tl.load(bt_row + n // BLOCK_SIZE, mask=n < seq_len, other=0).to(tl.int64)
    kv_off = block * stride_cache_block + (n % BLOCK_SIZE) * stride_cache_offset + head_off
    kv_mask = (n < upto)[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    return k, v, kv_off, n


@triton.jit
def _attend_tile(
    q, k, v, n_mask, m_i, l_i, acc, scale_log2, PRECISION: tl.constexpr,
    FRAGMENT_SUM: tl.constexpr,
):  # fmt: skip
    """One step of the online softmax over a KV tile: (m_i, l_i, acc) updated with the
    keys ``k`` and values ``v`` [BLOCK_N, BLOCK_D] whose rows ``n_mask`` holds (>= 1)."""
    # s: [BLOCK_G, BLOCK_N], in log2 units
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * scale_log2
    s = tl.where(n_mask[None, :], s, float("-inf"))
    # Every tile holds >= 1 valid key, so the running max is finite.
    return online_softmax_step(s, v, m_i, l_i, acc, PRECISION, FRAGMENT_SUM)


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
    counters_ptr,
    raw_q_ptr,  # ROPE: this step's q, k, v [B, heads, head_dim] before rotation
    raw_k_ptr,
    raw_v_ptr,
    k_out_ptr,  # ROPE: [B, n_kv, head_dim] scratch for the rotated k
    q_norm_ptr,  # ROPE and HAS_NORM: [head_dim] q/k norm weights
    k_norm_ptr,
    positions_ptr,  # ROPE: [B] positions
    cos_sin_ptr,  # ROPE: [max_positions, rotary_dim] float32
    slot_ptr,  # ROPE: [B] cache slots (< 0: store nothing)
    scale_log2,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_cache_block,
    stride_cache_offset,
    stride_cache_head,
    stride_bt,
    stride_rqb,
    stride_rqh,
    stride_rkb,
    stride_rkh,
    stride_rvb,
    stride_rvh,
    stride_kob,
    stride_koh,
    stride_cs,
    num_heads,
    head_dim,
    rope_eps,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    MIN_SPLIT_TILES: tl.constexpr,  # tiles a split takes at least (the later ones go empty)
    BLOCK_GQ: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK_S: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    PRECISION: tl.constexpr,
    FRAGMENT_SUM: tl.constexpr,  # the row sum in cuDNN's order (_online_softmax)
    PDL: tl.constexpr,
    ROPE: tl.constexpr,  # rotate q and k here and store k and v first (see DecodeRotation)
    HALF: tl.constexpr,  # ROPE: rotary_dim // 2
    HEAD_DIM: tl.constexpr,  # ROPE: head_dim
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    HAS_NORM: tl.constexpr,
    NORM_ORDER: tl.constexpr,  # ROPE and HAS_NORM: the q/k norm's sum order (rope.py)
    EARLY_TILE: tl.constexpr,  # load the split's first KV tile before the wait (see above)
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    let_next_kernel_launch(PDL)
    # Before the wait, what no kernel of this step's chain writes: the host-staged step
    # inputs (lengths, block tables, positions, slots) and (EARLY_TILE) the KV of earlier
    # tokens, whose first tile of this split loads while the kernel before still runs.
    # The step's own token (position seq_len - 1) is stored after the wait (here with
    # ROPE, else by the kernel before), so its row is read after it.
    seq_len = tl.load(seq_lens_ptr + seq)
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.maximum(tl.cdiv(num_tiles, NUM_SPLITS), MIN_SPLIT_TILES)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g  # [BLOCK_G]
    g_mask = g < GROUP
    d_mask = d < head_dim
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_off = kv_head * stride_cache_head
    now = seq_len - 1  # this step's token
    if EARLY_TILE:
        k_first, v_first, off_first, n_first = _kv_tile(
            k_cache_ptr, v_cache_ptr, bt_row, tile_lo, seq_len, head_off, stride_cache_block,
            stride_cache_offset, now, d, d_mask, BLOCK_N, BLOCK_SIZE,
        )  # fmt: skip
    if ROPE:
        token = seq.to(tl.int64)
        cos, sin = token_cos_sin(
            positions_ptr, cos_sin_ptr, stride_cs, token, q_ptr.dtype.element_ty, HALF,
            BLOCK_HALF,
        )  # fmt: skip
        cache_heads, slot_row = token_slot(
            slot_ptr, token, 1, stride_cache_block, stride_cache_offset, BLOCK_SIZE
        )
        wait_only_for_previous_kernel(PDL)
        # Every split of this (sequence, KV head) does the same: rotate the group's q
        # heads into q_ptr's rows and store the head's rotated k and its v into the cache.
        # Splits writing the same values to the same places race harmlessly; the barrier
        # makes this program's own writes visible to all its threads before they read.
        rotate_and_store(
            raw_q_ptr, raw_k_ptr, raw_v_ptr, q_ptr, k_out_ptr, k_cache_ptr, v_cache_ptr,
            q_norm_ptr, k_norm_ptr, cos, sin, cache_heads, slot_row + head_off, seq, kv_head,
            stride_rqb, stride_rqh, stride_rkb, stride_rkh, stride_rvb, stride_rvh,
            stride_qb, stride_qh, stride_kob, stride_koh, rope_eps,
            GROUP, BLOCK_GQ, BLOCK_D, HALF, HEAD_DIM, BLOCK_HALF, BLOCK_PASS, HAS_NORM,
            NORM_ORDER,
        )  # fmt: skip
        tl.debug_barrier()
    else:
        wait_only_for_previous_kernel(PDL)

    # q: [BLOCK_G, BLOCK_D]; padded rows are zeros (their results are never stored)
    q = tl.load(
        q_ptr + seq.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = initial_row_sum(BLOCK_G, FRAGMENT_SUM)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    rest = tile_lo
    if EARLY_TILE:
        rest = tile_lo + 1
        if tile_lo < tile_hi:
            # the first tile, with this step's token's row (if there) read now
            is_now = (n_first == now)[:, None] & d_mask[None, :]  # [BLOCK_N, BLOCK_D]
            at_now = off_first[:, None] + d[None, :]
            k_now = tl.load(k_cache_ptr + at_now, mask=is_now, other=0.0)
            v_now = tl.load(v_cache_ptr + at_now, mask=is_now, other=0.0)
            m_i, l_i, acc = _attend_tile(
                q, tl.where(is_now, k_now, k_first), tl.where(is_now, v_now, v_first),
                n_first < seq_len, m_i, l_i, acc, scale_log2, PRECISION, FRAGMENT_SUM,
            )  # fmt: skip
    for tile in range(rest, tile_hi):
        k, v, _, n = _kv_tile(
            k_cache_ptr, v_cache_ptr, bt_row, tile, seq_len, head_off, stride_cache_block,
            stride_cache_offset, seq_len, d, d_mask, BLOCK_N, BLOCK_SIZE,
        )  # fmt: skip
        m_i, l_i, acc = _attend_tile(
            q, k, v, n < seq_len, m_i, l_i, acc, scale_log2, PRECISION, FRAGMENT_SUM
        )
    l_i = row_sum(l_i, FRAGMENT_SUM)  # [BLOCK_G]

    if NUM_SPLITS == 1:
        out = normalized(acc, l_i)  # seq_len 0: no keys, zeros
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
        if FUSED_MERGE:
            # Counter [B, n_kv]: arrivals of this (sequence, KV head)'s splits. The barrier
            # orders every thread's partial stores before the (single-thread) release; the
            # acquire makes the other programs' partials visible to the last arrival.
            tl.debug_barrier()
            counter = counters_ptr + seq * tl.num_programs(1) + kv_head
            arrived = tl.atomic_add(counter, 1, sem="acq_rel")
            if arrived == NUM_SPLITS - 1:
                merge_group(
                    out_ptr,
                    part_acc_ptr,
                    part_max_ptr,
                    part_sum_ptr,
                    seq,
                    kv_head,
                    stride_ob,
                    stride_oh,
                    num_heads,
                    head_dim,
                    GROUP,
                    NUM_SPLITS,
                    BLOCK_GQ,
                    BLOCK_S,
                    CHUNK_S,
                    BLOCK_D,
                )
                # Every split has arrived: zero it for the next launch (or graph replay).
                tl.store(counter, 0)


def cudnn_min_split_tiles(head_dim: int) -> int:
    """``min_split_tiles`` for cuDNN's bits (module docstring): 4 where the kernels
    follow its numerics (head_dim <= 64), so up to 256 keys run in one pass; else 1."""
    return 4 if follows_cudnn_tiles(head_dim) else 1


def tile_warps(head_dim: int, block_g: int) -> int:
    """Warps per program of the decode kernel. Where ``follows_cudnn_tiles``, one warp per 16 rows,
    as cuDNN lays its warps (``_online_softmax``): each warp then holds all of the tile's
    keys for its rows, so a row's sum over the tile is one thread's fold and a shuffle
    (spread over warps along the keys, it is added in another order: an ulp off at 6 of
    17 traced SmolLM2 sites). Wider heads keep the tuned _NUM_WARPS: there cuDNN's order
    is not matched either way."""
    return max(1, block_g // 16) if follows_cudnn_tiles(head_dim) else _NUM_WARPS


def choose_num_splits(
    batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device | str
) -> int:
    """Splits per sequence so that about two programs per SM are in flight, without
    giving a split fewer than two tiles of the longest sequence. Host-only arithmetic.
    (On an H200 at batch 64 x 8 KV heads, one split already streams the cache at ~4.4
    TB/s; more only add the merge.)"""
    programs = max(1, batch * num_kv_heads)
    want = -(-2 * num_sms(torch.device(device)) // programs)
    by_length = max(1, -(-max_seq_len // _BLOCK_N) // 2)
    return max(1, min(want, by_length, _MAX_SPLITS))


def paged_decode_attention(
    q: torch.Tensor,  # [B, n_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
    seq_lens: torch.Tensor,  # [B] int32, including this step's token (0: zeros out)
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    scale: float,
    *,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,  # [B, n_heads, head_dim]
    fused_merge: bool = True,
    pdl: bool = False,  # launch with programmatic dependent launch (kernels/_pdl.py)
    rotation: DecodeRotation | None = None,  # q is raw: rotate it, store k/v, then attend
    early_tile: bool | None = None,  # first KV tile before the wait; None: with PDL only
    min_split_tiles: int = 1,  # KV tiles a split takes at least (module docstring)
) -> torch.Tensor:  # [B, n_heads, head_dim] in q's dtype (or out's)
    """Attention of each sequence's single query over its whole paged KV (causality is
    implicit: the query is the last position). The token's own K/V must already be in
    the cache (``kv_cache_write``). ``num_splits`` fixes the split-K factor; by default it
    is chosen from ``max_seq_len`` (a host-side bound, e.g. from ``seq_lens_cpu``; the
    cache's capacity per sequence when omitted). With several splits, ``fused_merge``
    merges them in the same launch (see the module docstring), else in a second one.
    With ``rotation`` (:class:`DecodeRotation`) the same launch first does the rope
    kernel's work (q/k norm, rotation, K/V store); q is then the raw q. ``early_tile``
    loads each split's first KV tile before the wait for the kernel before (the same
    bits either way); by default only a dependent launch does, which has a kernel to
    overlap it with: the early tile's registers stay live across the rotation, which
    costs spills (sm90: 42 local stores against 3 at one split), so plain launches
    (batch > 16, eager) keep the loop as it was.
    A sequence of length 0 (padding) gets zeros. No host sync."""
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
    if min_split_tiles < 1:
        raise ValueError(f"min_split_tiles must be >= 1, got {min_split_tiles}")
    block_d = next_power_of_2(head_dim)
    block_g = max(_MIN_BLOCK_G, next_power_of_2(group))
    block_gq = next_power_of_2(group)  # the merge needs no tl.dot padding
    block_s = next_power_of_2(num_splits)
    chunk_s = min(block_s, max(1, MERGE_TILE // (block_gq * block_d)))
    merge_meta = dict(BLOCK_GQ=block_gq, BLOCK_S=block_s, CHUNK_S=chunk_s, BLOCK_D=block_d)
    if num_splits > 1:
        part_acc = torch.empty(
            batch, n_heads, num_splits, block_d, dtype=torch.float32, device=q.device
        )
        part_max = torch.empty(batch, n_heads, num_splits, dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_acc = part_max = part_sum = out  # unused
    fused = fused_merge and num_splits > 1
    counters = arrival_counters(COUNTERS, q.device, batch * n_kv) if fused else out  # [>= B*n_kv]
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    if rotation is not None:
        rope_meta = rope_launch_args(rotation, q, kv_cache)
        raw_q, q = q, torch.empty(q.shape, dtype=q.dtype, device=q.device)  # q: rotated
        rope_tensors, rope_strides = rotation_tensors(rotation, raw_q, q.dtype)
    else:  # placeholders the kernel never reads
        rope_meta, rope_tensors, rope_strides = NO_ROPE_META, (q,) * 9, (0,) * 9
    launch = pdl_launch(pdl, q.device)
    early = launch["PDL"] if early_tile is None else early_tile
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
        counters,
        *rope_tensors,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        *rope_strides,
        n_heads,
        head_dim,
        rotation.eps if rotation is not None else 0.0,
        GROUP=group,
        BLOCK_G=block_g,
        BLOCK_N=_BLOCK_N,
        BLOCK_SIZE=block_size,
        NUM_SPLITS=num_splits,
        MIN_SPLIT_TILES=min_split_tiles,
        FUSED_MERGE=fused,
        PRECISION=dot_precision(q.dtype),
        FRAGMENT_SUM=follows_cudnn_tiles(head_dim),
        **merge_meta,
        **rope_meta,
        EARLY_TILE=early,
        num_warps=tile_warps(head_dim, block_g),
        num_stages=_NUM_STAGES,
        **launch,
    )
    if num_splits > 1 and not fused:
        decode_reduce_kernel[(batch, n_kv)](
            out,
            part_acc,
            part_max,
            part_sum,
            out.stride(0),
            out.stride(1),
            n_heads,
            head_dim,
            GROUP=group,
            NUM_SPLITS=num_splits,
            **merge_meta,
            num_warps=_NUM_WARPS,
            **pdl_launch(pdl, q.device),
        )
    return out
