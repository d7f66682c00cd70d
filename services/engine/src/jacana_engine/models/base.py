"""What every model family implements, and the architecture facts the engine needs.

``ModelConfig`` is the normalized view of an HF ``config.json`` or GGUF metadata; model
code reads only this, never the raw file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from jacana_engine.worker.attention_metadata import AttentionMetadata


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters of a decoder-only transformer (HF naming)."""

    architecture: str  # HF architecture name, e.g. "LlamaForCausalLM"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    attention_out_bias: bool = False  # o_proj carries a bias (Llama/Qwen3 attention_bias)
    qk_norm: bool = False  # RMSNorm on q and k per head before RoPE (Qwen3)
    rope_scaling: dict | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)


class CausalLM(Protocol):
    """A decoder over a flattened batch of tokens with a paged KV cache.

    The batch is ``T`` tokens from ``B`` sequences laid end to end (prefill chunks and
    single decode tokens mixed); ``meta`` says which tokens belong to which sequence and
    where their K/V go.
    """

    config: ModelConfig

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64, position of each token in its sequence
        kv_caches: list[torch.Tensor],  # per layer [2, num_blocks, block_size, n_kv, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # hidden states [T, hidden_size]
        """Run all layers; writes this step's K/V into ``kv_caches`` at ``meta.slot_mapping``."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> logits [N, vocab_size] in float32: the float32 copy of
        ``logits_in_model_dtype``."""
        ...

    def logits_in_model_dtype(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> logits [N, vocab_size] as the lm_head GEMM writes
        them (the model dtype): what a decode graph keeps, and greedy decoding's argmax
        reads without a float32 copy."""
        ...
