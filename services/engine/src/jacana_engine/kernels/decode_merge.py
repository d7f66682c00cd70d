"""The log-sum-exp merge of paged decode attention's per-split partials.

``paged_decode_attention`` (``decode_attention.py``) runs its splits' merge either in the
same launch, by the last program of each (sequence, KV head) group to arrive
(``merge_group``), or in a second launch (``decode_reduce_kernel``, the same code). The
partials are float32 scratch written by the splits: accumulator [.., BLOCK_D], running
max and running sum, all in log2 units.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jacana_engine.kernels._online_softmax import normalized
from jacana_engine.kernels._pdl import wait_for_previous_kernel

# fp32 partial elements a merge step holds (group heads x splits x head_dim): 128 per
# thread at 4 warps. Fewer splits a step measured slower on an H200 (batch 1, 4096 tokens).
MERGE_TILE = 16384


@triton.jit
def merge_group(
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
    GROUP: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_GQ: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out[seq, kv_head's query heads] = the log-sum-exp merge of their NUM_SPLITS partials.

    All heads of the group at once, CHUNK_S splits a step: the loads of a step are issued
    together, which is what makes the merge short (one head at a time, each waiting for
    L2, made the fused merge slower than a second launch). Partials are loaded with
    ``.cg`` (from L2, not this SM's L1): in the fused merge other programs wrote them, and
    an L1 line left by an earlier launch could be stale."""
    j = tl.arange(0, BLOCK_GQ)
    d = tl.arange(0, BLOCK_D)
    j_mask = j < GROUP
    head_rows = (seq.to(tl.int64) * num_heads + kv_head * GROUP + j) * NUM_SPLITS  # [BLOCK_GQ]
    # max/sum of every split first ([BLOCK_GQ, BLOCK_S], small); then the accumulators
    s = tl.arange(0, BLOCK_S)
    js_mask = j_mask[:, None] & (s < NUM_SPLITS)[None, :]
    row = head_rows[:, None] + s[None, :]  # [BLOCK_GQ, BLOCK_S]
    m = tl.load(part_max_ptr + row, mask=js_mask, other=float("-inf"), cache_modifier=".cg")
    sums = tl.load(part_sum_ptr + row, mask=js_mask, other=0.0, cache_modifier=".cg")
    # Empty or padded splits (max -inf) weigh 0. The floor changes no finite max; it keeps
    # the weights of a sequence of length 0 (or a padded head) at 0 instead of NaN.
    m_all = tl.maximum(tl.max(m, axis=1), -3.0e38)  # [BLOCK_GQ]
    l_all = tl.sum(sums * tl.exp2(m - m_all[:, None]), axis=1)  # [BLOCK_GQ]
    num = tl.zeros([BLOCK_GQ, BLOCK_D], dtype=tl.float32)
    for c in tl.static_range(0, BLOCK_S, CHUNK_S):
        sc = c + tl.arange(0, CHUNK_S)
        c_mask = j_mask[:, None] & (sc < NUM_SPLITS)[None, :]
        crow = head_rows[:, None] + sc[None, :]  # [BLOCK_GQ, CHUNK_S]
        mc = tl.load(part_max_ptr + crow, mask=c_mask, other=float("-inf"), cache_modifier=".cg")
        acc = tl.load(
            part_acc_ptr + crow[:, :, None] * BLOCK_D + d[None, None, :],
            mask=c_mask[:, :, None],
            other=0.0,
            cache_modifier=".cg",
        )  # [BLOCK_GQ, CHUNK_S, BLOCK_D]
        num += tl.sum(acc * tl.exp2(mc - m_all[:, None])[:, :, None], axis=1)
    out = normalized(num, l_all)  # [BLOCK_GQ, BLOCK_D]; no keys: 0
    tl.store(
        out_ptr
        + seq.to(tl.int64) * stride_ob
        + (kv_head * GROUP + j)[:, None] * stride_oh
        + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=j_mask[:, None] & (d < head_dim)[None, :],
    )


@triton.jit
def decode_reduce_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    stride_ob,
    stride_oh,
    num_heads,
    head_dim,
    GROUP: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_GQ: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    """The unfused merge: one program per (sequence, KV head), the fused merge's code."""
    wait_for_previous_kernel(PDL)
    merge_group(
        out_ptr,
        part_acc_ptr,
        part_max_ptr,
        part_sum_ptr,
        tl.program_id(0),
        tl.program_id(1),
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
