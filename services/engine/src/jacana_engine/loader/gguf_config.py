"""``ModelConfig`` from a GGUF header (``{arch}.*`` and ``tokenizer.ggml.*`` keys).

Facts llama.cpp does not store as metadata are read off the tensor directory: the vocab
size (embedding rows), tied embeddings (no ``output.weight``), q/k/v bias and q/k norm.
"""

from __future__ import annotations

from typing import Any

from jacana_engine.loader.gguf_metadata import GGUFHeader
from jacana_engine.models.base import ModelConfig
from jacana_engine.models.registry import arch_spec_for_gguf, check_model_config


def _rope_scaling(md: dict[str, Any], arch: str) -> dict[str, Any] | None:
    kind = md.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(md[f"{arch}.rope.scaling.factor"])}
    raise ValueError(f"GGUF rope scaling {kind!r} is not supported (supported: none, linear)")


def model_config_from_gguf(header: GGUFHeader) -> ModelConfig:
    """Normalize a GGUF header into a ``ModelConfig``; ``ValueError`` if unsupported."""
    md = header.metadata
    arch = md.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("GGUF file lacks general.architecture")
    spec = arch_spec_for_gguf(arch)
    names = {t.name for t in header.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(
            "GGUF carries rope_freqs (Llama-3.1-style frequency factors), which this loader "
            "does not apply; load the HF safetensors checkpoint instead"
        )
    embd = header.tensor("token_embd.weight")
    if embd is None:
        raise ValueError("GGUF file lacks token_embd.weight")

    def key(name: str, default: Any = None) -> Any:
        value = md.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF file lacks {arch}.{name}")
        return value

    hidden = int(key("embedding_length"))
    n_heads = int(key("attention.head_count"))
    n_kv = key("attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):
        if len(set(n_kv)) != 1:
            raise ValueError(f"per-layer KV head counts {sorted(set(n_kv))} are not supported")
        n_kv = n_kv[0]
    head_dim = int(md.get(f"{arch}.attention.key_length", hidden // n_heads))
    value_dim = int(md.get(f"{arch}.attention.value_length", head_dim))
    rope_dim = int(md.get(f"{arch}.rope.dimension_count", head_dim))
    if value_dim != head_dim or rope_dim != head_dim:
        raise ValueError(
            f"GGUF head sizes differ (key {head_dim}, value {value_dim}, rope {rope_dim}); "
            "partial rotary and unequal K/V sizes are not supported"
        )
    eos = [md[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in md]
    config = ModelConfig(
        architecture=spec.architecture,
        vocab_size=embd.shape[0],
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=n_heads,
        num_key_value_heads=int(n_kv),
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(md.get(f"{arch}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        attention_out_bias="blk.0.attn_output.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        rope_scaling=_rope_scaling(md, arch),
        bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(int(t) for t in eos)),
    )
    if config.qk_norm != spec.qk_norm:
        raise ValueError(
            f"GGUF {arch}: q/k norm tensors {'present' if config.qk_norm else 'absent'}, "
            f"but {spec.architecture} {'uses' if spec.qk_norm else 'has no'} q/k norm"
        )
    check_model_config(config)
    return config
