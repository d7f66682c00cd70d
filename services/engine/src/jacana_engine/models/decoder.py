"""The one decoder-only transformer behind every supported family (Llama, Qwen2, Qwen3).

Parameters live wherever the loader materialized them (usually the GPU); the KV cache is
passed in by the model runner each step. Parameter names follow HF except that q/k/v and
gate/up are fused (``qkv_proj``, ``gate_up_proj``); ``load_weights`` maps HF names onto them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from jacana_common.linear_backends import LinearBackend, TorchLinear
from jacana_engine.layers.attention_backend import AttentionBackend
from jacana_engine.layers.linear import Linear, MergedLinear
from jacana_engine.layers.mlp import GatedMLP
from jacana_engine.layers.norm import RMSNorm
from jacana_engine.layers.ops import LayerOps, TorchOps
from jacana_engine.layers.rotary import RotaryEmbedding
from jacana_engine.models.attention import DecoderAttention
from jacana_engine.models.base import ModelConfig
from jacana_engine.worker.attention_metadata import AttentionMetadata

# HF sub-module name -> (our fused module, shard)
_FUSED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
# Top-level names of a bare decoder checkpoint (no lm_head, no "model." prefix).
_BARE_DECODER_ROOTS = frozenset({"embed_tokens", "layers", "norm"})
# Checkpoint entries that are not parameters of ours (recomputed buffers).
_IGNORED = re.compile(r".*\.rotary_emb\.inv_freq$")


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``.

    The residual stream is carried separately (vLLM style) so each residual add fuses
    into the next norm: ``forward`` stops before its down projection and returns that
    projection's input with the residual, and whoever comes next runs the projection,
    the add and its norm together (``RMSNorm.between``).
    """

    def __init__(
        self, config: ModelConfig, backend: AttentionBackend, ops: LayerOps | None = None
    ) -> None:
        super().__init__()
        ops = ops or TorchOps()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = DecoderAttention(config, backend, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, ops)

    def forward(
        self,
        x: torch.Tensor,  # the embeddings [T, hidden], or ``producer``'s input
        residual: torch.Tensor | None,  # [T, hidden]; None for the first layer
        rope_tables: Any,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        producer: Linear | None = None,  # the previous layer's down projection
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (gate_up [T, 2 * inter], residual [T, hidden])
        """The block up to its down projection, whose input it returns: the next layer (or
        the final norm) runs that projection with its own input norm after it
        (``RMSNorm.between``), the activation folded into its launch. Where gate_up's
        launch activates (``SkinnyConfig.activates``) that input is [T, inter], activated."""
        if producer is None:
            qkv, residual = self.input_layernorm.then(self.self_attn.qkv_proj, x, residual)
        else:
            qkv, residual = self.input_layernorm.between(
                producer, x, residual, self.self_attn.qkv_proj, gated=True
            )
        heads = self.self_attn.attend_heads(qkv, rope_tables, kv_cache, meta)
        return self.post_attention_layernorm.between(
            self.self_attn.o_proj, heads, residual, self.mlp.gate_up_proj
        )


class DecoderModel(nn.Module):
    """Embedding, the layer stack and the final norm (HF's ``model.*``)."""

    def __init__(
        self, config: ModelConfig, backend: AttentionBackend, ops: LayerOps | None = None
    ) -> None:
        super().__init__()
        self.ops = ops or TorchOps()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, backend, self.ops) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, self.ops)
        self.rotary_emb = RotaryEmbedding(
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
            max_positions=config.max_position_embeddings,
        )


class DecoderForCausalLM(nn.Module):
    """Implements ``CausalLM`` for every registered architecture.

    With tied embeddings there is no ``lm_head`` module: logits use the embedding matrix
    directly, so the tie survives ``to_empty`` and dtype casts. ``ops`` (default torch)
    picks the norm/RoPE/activation implementation for every layer at build time.
    """

    def __init__(
        self, config: ModelConfig, backend: AttentionBackend, ops: LayerOps | None = None
    ) -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.model = DecoderModel(config, backend, ops)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.logits_gemm: LinearBackend = TorchLinear()  # see layers.linear.use_linear_backend

    def use_dependent_launch(self, enabled: bool = True) -> None:
        """Launch the attention backend's and the layer ops' kernels with programmatic
        dependent launch from now on (``kernels/_pdl.py``; implementations without such
        kernels ignore it). Set before capturing graphs: a graph keeps its launches."""
        self.backend.dependent_launch = enabled
        self.model.ops.dependent_launch = enabled

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[torch.Tensor],  # per layer [2, num_blocks, block_size, n_kv, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        if len(kv_caches) != len(self.model.layers):
            raise ValueError(f"got {len(kv_caches)} KV caches for {len(self.model.layers)} layers")
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        tables = self.model.ops.rope_tables(self.model.rotary_emb, positions, x.dtype)
        residual, producer = None, None
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, tables, kv_cache, meta, producer)
            producer = layer.mlp.down_proj  # x is its input (gate_up)
        if producer is None:
            return self.model.norm(x)
        return self.model.norm.between(producer, x, residual, None, gated=True)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [N, hidden] -> [N, vocab] float32
        return self.logits_in_model_dtype(hidden).float()

    def logits_in_model_dtype(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [N, hidden] -> [N, vocab] in the model dtype. An untied lm_head runs as
        # the Linear it is, on the decode-GEMM tuner's pick for N rows where it made one.
        if self.lm_head is not None:
            return self.lm_head(hidden)
        return self.logits_gemm.linear(hidden, self.model.embed_tokens.weight, None)

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers after ``to_empty``/dtype casts."""
        self.model.rotary_emb.reset_buffers(self.model.embed_tokens.weight.device)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors into the parameters, one at a time.

        Raises ``ValueError`` on an unknown name, a shape mismatch, or a parameter (or
        fused shard) the checkpoint never provided.
        """
        params = dict(self.named_parameters())
        pending: set[tuple[str, str | None]] = set()
        for name, module in self.named_modules():
            for pname, _ in module.named_parameters(recurse=False):
                shards = module.shard_sizes if isinstance(module, MergedLinear) else [None]
                pending.update((f"{name}.{pname}", s) for s in shards)
        for hf_name, tensor in weights:
            if _IGNORED.match(hf_name) or (hf_name == "lm_head.weight" and self.lm_head is None):
                continue
            target, shard = self._resolve(hf_name)
            if target not in params:
                raise ValueError(f"checkpoint tensor {hf_name!r} matches no parameter")
            if shard is None:
                param = params[target]
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ValueError(
                        f"{hf_name}: checkpoint shape {tuple(tensor.shape)}, "
                        f"expected {tuple(param.shape)}"
                    )
                param.data.copy_(tensor)
            else:
                module_name, pname = target.rsplit(".", 1)
                self.get_submodule(module_name).load_shard(shard, pname, tensor)
            pending.discard((target, shard))
        if pending:
            missing = sorted(f"{n}[{s}]" if s else n for n, s in pending)
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")

    @staticmethod
    def _resolve(hf_name: str) -> tuple[str, str | None]:
        """HF parameter name -> (our parameter name, fused shard or None).

        Checkpoints of the bare decoder (``Qwen3Model``, as Qwen3-Embedding ships) name
        its tensors without the ``model.`` prefix of the ``*ForCausalLM`` classes."""
        if hf_name.split(".", 1)[0] in _BARE_DECODER_ROOTS:
            hf_name = f"model.{hf_name}"
        parts = hf_name.split(".")
        if len(parts) >= 2 and parts[-2] in _FUSED:
            module, shard = _FUSED[parts[-2]]
            return ".".join([*parts[:-2], module, parts[-1]]), shard
        return hf_name, None
