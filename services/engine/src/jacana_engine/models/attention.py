"""The self-attention block of the decoder: fused QKV, optional q/k norm, RoPE, paged attention."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from jacana_engine.layers.attention_backend import AttentionBackend
from jacana_engine.layers.linear import Linear, MergedLinear
from jacana_engine.layers.norm import RMSNorm
from jacana_engine.layers.ops import LayerOps, TorchOps
from jacana_engine.models.base import ModelConfig
from jacana_engine.worker.attention_metadata import AttentionMetadata


class DecoderAttention(nn.Module):
    """Multi-head / grouped-query attention of one layer.

    Llama: plain projections (``attention_bias`` adds biases to q/k/v and o). Qwen2: q/k/v
    carry a bias. Qwen3: RMSNorm over each head of
    q and k before RoPE. All three differ only in the flags of ``ModelConfig``.
    """

    def __init__(
        self, config: ModelConfig, backend: AttentionBackend, ops: LayerOps | None = None
    ) -> None:
        super().__init__()
        self.ops = ops or TorchOps()
        self.eps = config.rms_norm_eps
        self.qk_norm = config.qk_norm
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.backend = backend
        q_size = self.n_heads * self.head_dim
        kv_size = self.n_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            config.hidden_size,
            {"q": q_size, "k": kv_size, "v": kv_size},
            bias=config.attention_bias,
        )
        self.o_proj = Linear(q_size, config.hidden_size, bias=config.attention_out_bias)
        norm = (lambda: RMSNorm(self.head_dim, config.rms_norm_eps)) if config.qk_norm else None
        self.q_norm = norm() if norm else nn.Identity()
        self.k_norm = norm() if norm else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        rope_tables: Any,  # from ``ops.rope_tables`` for this step's positions
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        return self.attend(self.qkv_proj(x), rope_tables, kv_cache, meta)

    def attend(
        self,
        qkv: torch.Tensor,  # [T, (n_heads + 2 * n_kv) * head_dim]: qkv_proj's output
        rope_tables: Any,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        """The block after the QKV projection: rotate, attend, project out."""
        return self.o_proj(self.attend_heads(qkv, rope_tables, kv_cache, meta))

    def attend_heads(
        self,
        qkv: torch.Tensor,  # [T, (n_heads + 2 * n_kv) * head_dim]: qkv_proj's output
        rope_tables: Any,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, n_heads * head_dim]: o_proj's input
        """Rotate and attend: the block between the QKV and output projections."""
        t = qkv.shape[0]
        q, k, v = self.qkv_proj.split(qkv)
        q = q.view(t, self.n_heads, self.head_dim)  # [T, n_heads, head_dim]
        k = k.view(t, self.n_kv_heads, self.head_dim)  # [T, n_kv, head_dim]
        v = v.view(t, self.n_kv_heads, self.head_dim)
        q_w = self.q_norm.weight if self.qk_norm else None
        k_w = self.k_norm.weight if self.qk_norm else None
        rotation = None
        if self.backend.rotates_decode(meta, t):
            rotation = self.ops.decode_rotation(
                k, v, rope_tables, q_w, k_w, self.eps, meta.slot_mapping
            )
        if rotation is not None:
            # One launch rotates, stores k/v and attends (a decode step, where the backend
            # folds the ops' rotation into its kernel)
            out = self.backend.forward(q, k, v, kv_cache, meta, self.scale, rotation=rotation)
        elif self.ops.fuses_kv_store and self.backend.accepts_written_kv:
            # One launch rotates q/k and stores k/v into the cache (saves the backend's
            # own write launch per layer).
            q, k = self.ops.rotate_and_store(
                q, k, v, rope_tables, q_w, k_w, self.eps, kv_cache, meta.slot_mapping
            )
            out = self.backend.forward(q, k, v, kv_cache, meta, self.scale, kv_written=True)
        else:
            q, k = self.ops.rotate(q, k, rope_tables, q_w, k_w, self.eps)
            out = self.backend.forward(q, k, v, kv_cache, meta, self.scale)
        # out: [T, n_heads, head_dim]
        return out.reshape(t, self.n_heads * self.head_dim)
