"""The rope kernel's work folded into the decode attention launch.

With ``paged_decode_attention(rotation=DecodeRotation(...))`` every program of a
(sequence, KV head) first normalizes and rotates its group's q heads and this step's k,
and stores k and v into the paged cache, with ``kernels.rope``'s helpers, so the bits are
the rope kernel's; then it attends. One launch fewer per layer and decode step.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._common import check_kv_write, next_power_of_2
from jacana_engine.kernels._row_sum_order import HEAD_SUM_TRITON
from jacana_engine.kernels.rope import qk_norm_order, rope_heads


@triton.jit
def rotate_and_store(
    raw_q_ptr, raw_k_ptr, raw_v_ptr, q_ptr, k_out_ptr, k_cache_ptr, v_cache_ptr,
    q_norm_ptr, k_norm_ptr, cos, sin, cache_heads, slot_row, seq, kv_head,
    stride_rqb, stride_rqh, stride_rkb, stride_rkh, stride_rvb, stride_rvh,
    stride_qb, stride_qh, stride_kob, stride_koh, eps,
    GROUP: tl.constexpr, BLOCK_GQ: tl.constexpr, BLOCK_D: tl.constexpr,
    HALF: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, HAS_NORM: tl.constexpr,
    NORM_ORDER: tl.constexpr,
):  # fmt: skip
    """The rope kernel's work for one sequence's token and one KV head's group: q/k norm
    and rotation of the GROUP q heads (into q_ptr) and of the k head (into k_out and the
    cache at ``slot_row``, this head's offset of the token's slot), v into the cache; the
    same helpers, so the same bits. ``cos``/``sin`` (``token_cos_sin``) and
    ``cache_heads`` (``token_slot``) come from host-staged inputs, read before the wait."""
    token = seq.to(tl.int64)
    first_q = kv_head * GROUP
    rope_heads(
        raw_q_ptr + first_q * stride_rqh, q_ptr + first_q * stride_qh, q_norm_ptr, q_ptr,
        token, stride_rqb, stride_rqh, stride_qb, stride_qh, 0, GROUP, 0, cos, sin, eps,
        HALF, HEAD_DIM, BLOCK_GQ, BLOCK_HALF, BLOCK_PASS, HAS_NORM, False, NORM_ORDER,
    )  # fmt: skip
    rope_heads(
        raw_k_ptr + kv_head * stride_rkh, k_out_ptr + kv_head * stride_koh, k_norm_ptr,
        k_cache_ptr + slot_row, token, stride_rkb, stride_rkh, stride_kob, stride_koh, 0, 1,
        cache_heads, cos, sin, eps, HALF, HEAD_DIM, 1, BLOCK_HALF, BLOCK_PASS, HAS_NORM, True,
        NORM_ORDER,
    )  # fmt: skip
    d = tl.arange(0, BLOCK_D)
    v_mask = d < cache_heads * HEAD_DIM  # nothing for a padding sequence
    v = tl.load(raw_v_ptr + token * stride_rvb + kv_head * stride_rvh + d, mask=v_mask)
    tl.store(v_cache_ptr + slot_row + d, v.to(v_cache_ptr.dtype.element_ty), mask=v_mask)


class DecodeRotation(NamedTuple):
    """The rope kernel's work that ``paged_decode_attention(rotation=...)`` does in its own
    launch before attending (one launch fewer per layer and decode step): the optional
    q/k RMSNorm over head_dim, the rotation of q (the call's raw q) and of this step's k,
    and the store of the rotated k and of v at the sequences' slots, with
    ``kernels.rope``'s helpers and rounding."""

    k: torch.Tensor  # [B, n_kv, head_dim], before norm and rotation
    v: torch.Tensor  # [B, n_kv, head_dim], stored as is
    positions: torch.Tensor  # [B]
    cos_sin_cache: torch.Tensor  # [max_positions, rotary_dim] float32
    slot_mapping: torch.Tensor  # [B] int64; < 0: stores nothing (padding)
    q_norm: torch.Tensor | None = None  # [head_dim] (Qwen3), with k_norm
    k_norm: torch.Tensor | None = None
    eps: float = 0.0


NO_ROPE_META = dict(
    ROPE=False, HALF=1, HEAD_DIM=1, BLOCK_HALF=1, BLOCK_PASS=0, HAS_NORM=False, NORM_ORDER=0
)


def rotation_tensors(
    rotation: DecodeRotation, raw_q: torch.Tensor, dtype: torch.dtype
) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
    """The kernel's rope tensors (raw q, k, v; k_out scratch; q/k norms; positions; table;
    slots) and strides (q, k, v, k_out: batch and head; the table's row)."""
    k_out = torch.empty(rotation.k.shape, dtype=dtype, device=raw_q.device)
    norms = (rotation.q_norm, rotation.k_norm) if rotation.q_norm is not None else (raw_q,) * 2
    tensors = (raw_q, rotation.k, rotation.v, k_out, *norms, rotation.positions,
               rotation.cos_sin_cache, rotation.slot_mapping)  # fmt: skip
    strides = tuple(st for t in (raw_q, rotation.k, rotation.v, k_out) for st in t.stride()[:2])
    return tensors, (*strides, rotation.cos_sin_cache.stride(0))


def rope_launch_args(rotation: DecodeRotation, q: torch.Tensor, kv_cache: torch.Tensor) -> dict:
    """The kernel's rope constexprs, after checking ``rotation`` against q and the cache."""
    batch, _, head_dim = q.shape
    rotary_dim = rotation.cos_sin_cache.shape[1]
    check_kv_write(rotation.k, rotation.v, kv_cache, rotation.slot_mapping)
    if rotation.k.shape[0] != batch or rotation.positions.shape != (batch,):
        raise ValueError("rotation k / positions do not match q's batch")
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and <= head_dim {head_dim}")
    table = rotation.cos_sin_cache
    if table.dtype != torch.float32 or table.stride(1) != 1:
        raise ValueError("cos_sin_cache must be float32 with unit stride on its last dimension")
    has_norm = rotation.q_norm is not None
    if has_norm != (rotation.k_norm is not None):
        raise ValueError("q_norm and k_norm come together")
    if has_norm and (rotation.q_norm.shape != (head_dim,) or rotation.k_norm.shape != (head_dim,)):
        raise ValueError(f"q/k norm weights must be [{head_dim}]")
    pass_dim = head_dim - rotary_dim
    return dict(
        ROPE=True,
        HALF=rotary_dim // 2,
        HEAD_DIM=head_dim,
        BLOCK_HALF=next_power_of_2(rotary_dim // 2),
        BLOCK_PASS=next_power_of_2(pass_dim) if pass_dim else 0,
        HAS_NORM=has_norm,
        NORM_ORDER=qk_norm_order(head_dim, rotary_dim) if has_norm else HEAD_SUM_TRITON,
    )
