"""``ModelConfig`` from an HF ``config.json`` (plus ``generation_config.json`` for EOS ids).

Accepts both rope conventions: transformers ≥5 ``rope_parameters`` and the older
``rope_theta`` + ``rope_scaling`` pair.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jacana_engine.models.base import ModelConfig
from jacana_engine.models.registry import check_model_config, get_arch_spec


def config_json_path(path: str | Path) -> Path:
    """The config.json of an HF directory, or ``path`` itself if it is a .json file."""
    p = Path(path)
    found = p / "config.json" if p.is_dir() else p
    if not found.is_file():
        raise FileNotFoundError(f"no config.json at {p}")
    return found


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    params = dict(cfg.get("rope_parameters") or {})
    legacy = cfg.get("rope_scaling")
    theta = float(cfg.get("rope_theta") or params.pop("rope_theta", None) or 10000.0)
    params.pop("rope_theta", None)
    scaling = dict(legacy) if legacy else params
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, scaling


def _reject_unsupported(cfg: dict[str, Any]) -> None:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (only silu)")
    if cfg.get("mlp_bias"):
        raise ValueError("mlp_bias=true is not supported")
    if cfg.get("use_sliding_window"):
        raise ValueError("sliding-window attention is not supported")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial rotary embeddings are not supported")


def model_config_from_hf(
    cfg: dict[str, Any], generation_cfg: dict[str, Any] | None = None
) -> ModelConfig:
    """Normalize a parsed config.json into a ``ModelConfig``; ``ValueError`` if unsupported."""
    archs = cfg.get("architectures") or []
    if not archs:
        raise ValueError("config.json names no architecture ('architectures' is empty)")
    spec = get_arch_spec(archs[0])
    _reject_unsupported(cfg)
    n_heads = int(cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or int(cfg["hidden_size"]) // n_heads
    theta, scaling = _rope(cfg)
    eos = _ids(cfg.get("eos_token_id")) + _ids((generation_cfg or {}).get("eos_token_id"))
    flagged = bool(cfg.get("attention_bias", False))
    qkv_bias = spec.qkv_bias_always or flagged
    out_bias = flagged and not spec.qkv_bias_always
    config = ModelConfig(
        architecture=spec.architecture,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        num_attention_heads=n_heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or n_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=qkv_bias,
        attention_out_bias=out_bias,
        qk_norm=spec.qk_norm,
        rope_scaling=scaling,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(eos)),
    )
    check_model_config(config)
    return config


def read_hf_config(path: str | Path) -> ModelConfig:
    """``ModelConfig`` of an HF directory or a config.json file."""
    cfg_path = config_json_path(path)
    cfg = json.loads(cfg_path.read_text())
    gen_path = cfg_path.parent / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else None
    return model_config_from_hf(cfg, gen)
