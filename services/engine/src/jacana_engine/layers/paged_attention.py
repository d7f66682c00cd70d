"""Torch reference of paged attention: the oracle for faster backends, and the CPU path.

KV cache layout per layer: ``[2, num_blocks, block_size, n_kv_heads, head_dim]`` (K then V).
The cache tensor is owned by the model runner; this module only writes the new tokens'
slots and reads each sequence's blocks. Attention math runs in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from jacana_engine.layers.attention_backend import AttentionBackend
from jacana_engine.worker.attention_metadata import AttentionMetadata


def write_kv_cache(
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
    k: torch.Tensor,  # [T, n_kv, head_dim]
    v: torch.Tensor,  # [T, n_kv, head_dim]
    slot_mapping: torch.Tensor,  # [T] int64, block * block_size + offset
) -> None:
    """Store each token's K and V at its flat slot (in place)."""
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous (slots are addressed as a flat view)")
    slots = kv_cache.flatten(1, 2)  # [2, num_blocks * block_size, n_kv, head_dim], a view
    slots[0].index_copy_(0, slot_mapping, k.to(kv_cache.dtype))
    slots[1].index_copy_(0, slot_mapping, v.to(kv_cache.dtype))


def gather_kv(
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
    block_table: torch.Tensor,  # [max_blocks] int32
    seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``seq_len`` K and V rows of one sequence: two [seq_len, n_kv, head_dim]."""
    block_size = kv_cache.shape[2]
    n_blocks = -(-seq_len // block_size)
    blocks = block_table[:n_blocks].long()
    kv = kv_cache[:, blocks].flatten(1, 2)[:, :seq_len]  # [2, seq_len, n_kv, head_dim]
    return kv[0], kv[1]


def causal_attention(
    q: torch.Tensor,  # [q_len, n_heads, head_dim]
    k: torch.Tensor,  # [kv_len, n_kv, head_dim]
    v: torch.Tensor,  # [kv_len, n_kv, head_dim]
    scale: float,
) -> torch.Tensor:  # [q_len, n_heads, head_dim] float32
    """Queries are the last ``q_len`` positions of the ``kv_len`` keys; fp32 math, GQA."""
    q_len = q.shape[0]
    kv_len = k.shape[0]
    qh = q.float().transpose(0, 1)  # [n_heads, q_len, head_dim]
    # [n_kv, kv_len, head_dim]: SDPA's enable_gqa maps each query head to its KV head
    # (bit-identical to repeating K/V per group, without materializing the copies)
    kh = k.float().transpose(0, 1)
    vh = v.float().transpose(0, 1)
    mask = None
    if q_len > 1:
        # query i sits at position kv_len - q_len + i and sees keys 0..that position
        qpos = torch.arange(kv_len - q_len, kv_len, device=q.device)[:, None]
        mask = torch.arange(kv_len, device=q.device)[None, :] <= qpos  # [q_len, kv_len]
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def paged_attention(
    q: torch.Tensor,  # [T, n_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [T, n_heads, head_dim] in q's dtype
    """Attention of every sequence's queries over its cached K/V (one loop per sequence)."""
    out = torch.empty_like(q)
    start = 0
    for i, (q_len, seq_len) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True)):
        if q_len > seq_len:
            raise ValueError(f"sequence {i}: query_len {q_len} exceeds seq_len {seq_len}")
        k, v = gather_kv(kv_cache, meta.block_tables[i], seq_len)
        out[start : start + q_len] = causal_attention(q[start : start + q_len], k, v, scale)
        start += q_len
    if start != q.shape[0]:
        raise ValueError(f"query lengths sum to {start}, but the batch has {q.shape[0]} tokens")
    return out


class TorchAttentionBackend(AttentionBackend):
    """Reference backend: index_copy into the cache, then per-sequence SDPA in float32."""

    name = "torch"
    accepts_written_kv = True

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        kv_written: bool = False,
        rotation: object = None,
    ) -> torch.Tensor:
        if rotation is not None:
            raise ValueError("the torch backend does not rotate inside attention")
        if not kv_written:
            write_kv_cache(kv_cache, k, v, meta.slot_mapping)
        return paged_attention(q, kv_cache, meta, scale)
