"""GGUF tensor names (llama.cpp convention) -> HF parameter names."""

from __future__ import annotations

import re

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str:
    """The HF name of a GGUF tensor; ``ValueError`` if the tensor has no counterpart."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    m = _BLOCK_RE.fullmatch(gguf_name)
    if m is None or m.group(2) not in _BLOCK:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no counterpart in this model")
    layer, part, kind = m.groups()
    return f"model.layers.{layer}.{_BLOCK[part]}.{kind}"
