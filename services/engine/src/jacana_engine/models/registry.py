"""Supported architectures, keyed by HF architecture name, and model construction.

Each entry is data: how the family differs (bias on q/k/v, per-head q/k norm, GGUF
conventions). All entries share the one implementation in ``models.decoder``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jacana_engine.layers.attention_backend import (
    get_attention_backend,
    resolve_attention_backend,
)
from jacana_engine.layers.ops import get_layer_ops, layer_ops_for_backend
from jacana_engine.layers.rotary import check_rope_scaling
from jacana_engine.models.base import ModelConfig
from jacana_engine.models.decoder import DecoderForCausalLM


@dataclass(frozen=True)
class ArchSpec:
    """How one HF architecture maps onto the shared decoder.

    qkv_bias_always: the family always biases q/k/v and never o (Qwen2); otherwise
        config.json's ``attention_bias`` biases q/k/v and o alike.
    qk_norm: RMSNorm over each head of q and k before RoPE.
    gguf_arch: ``general.architecture`` of this family's GGUF files, if supported.
    gguf_permuted_qk: llama.cpp's converter permuted the Q/K rows (Llama only); the
        loader undoes it.
    """

    architecture: str
    qkv_bias_always: bool = False
    qk_norm: bool = False
    gguf_arch: str | None = None
    gguf_permuted_qk: bool = False
    model_cls: type[DecoderForCausalLM] = DecoderForCausalLM


ARCHITECTURES: dict[str, ArchSpec] = {
    spec.architecture: spec
    for spec in (
        ArchSpec("LlamaForCausalLM", gguf_arch="llama", gguf_permuted_qk=True),
        ArchSpec("Qwen2ForCausalLM", qkv_bias_always=True, gguf_arch="qwen2"),
        ArchSpec("Qwen3ForCausalLM", qk_norm=True, gguf_arch="qwen3"),
    )
}


def get_arch_spec(architecture: str) -> ArchSpec:
    """The spec of an HF architecture; ``ValueError`` lists the supported ones."""
    spec = ARCHITECTURES.get(architecture)
    if spec is None:
        raise ValueError(
            f"architecture {architecture!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        )
    return spec


def arch_spec_for_gguf(gguf_arch: str) -> ArchSpec:
    """The spec whose GGUF files say ``general.architecture = gguf_arch``."""
    for spec in ARCHITECTURES.values():
        if spec.gguf_arch == gguf_arch:
            return spec
    supported = sorted(s.gguf_arch for s in ARCHITECTURES.values() if s.gguf_arch)
    raise ValueError(f"GGUF architecture {gguf_arch!r} is not supported; supported: {supported}")


def check_model_config(config: ModelConfig) -> None:
    """Raise ``ValueError`` with a clear message if the decoder cannot run ``config``."""
    get_arch_spec(config.architecture)
    sizes = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
    }
    bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or v < 1}
    if bad:
        raise ValueError(f"model config has non-positive sizes: {bad}")
    if config.num_attention_heads % config.num_key_value_heads:
        raise ValueError(
            f"num_attention_heads {config.num_attention_heads} is not a multiple of "
            f"num_key_value_heads {config.num_key_value_heads}"
        )
    if config.head_dim % 2:
        raise ValueError(f"head_dim {config.head_dim} must be even for rotary embeddings")
    if not config.rms_norm_eps > 0 or not config.rope_theta > 0:
        raise ValueError("rms_norm_eps and rope_theta must be positive")
    check_rope_scaling(config.rope_scaling)


def build_model(
    config: ModelConfig,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    attention_backend: str = "torch",
    layer_ops: str | None = None,
) -> DecoderForCausalLM:
    """An uninitialized model with its parameters allocated on ``device`` in ``dtype``.

    Built on the meta device first, so no host copy and no random init happen; the caller
    fills every parameter (``load_weights`` or a dummy initializer). ``attention_backend``
    may be "auto" (triton on CUDA, torch elsewhere); ``layer_ops`` defaults to the ops that
    go with the backend (``layers.ops.layer_ops_for_backend``).
    """
    check_model_config(config)
    spec = get_arch_spec(config.architecture)
    attention_backend = resolve_attention_backend(attention_backend, device)
    backend = get_attention_backend(attention_backend)
    ops = get_layer_ops(layer_ops or layer_ops_for_backend(attention_backend))
    with torch.device("meta"):
        model = spec.model_cls(config, backend, ops)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.reset_buffers()
    return model
