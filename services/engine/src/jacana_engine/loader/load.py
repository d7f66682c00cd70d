"""Public entry points: the config of a checkpoint, and a ready-to-run model from it."""

from __future__ import annotations

from pathlib import Path

import torch

from jacana_common.linear_backends import select_linear_backend
from jacana_engine.config import EngineConfig
from jacana_engine.layers.linear import use_linear_backend
from jacana_engine.loader.registry import resolve_format
from jacana_engine.models.base import ModelConfig
from jacana_engine.models.decoder import DecoderForCausalLM
from jacana_engine.models.registry import build_model

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for ``EngineConfig.dtype``; ``ValueError`` lists the choices."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {sorted(DTYPES)}")
    return DTYPES[name]


def get_model_config(path: str | Path, load_format: str = "auto") -> ModelConfig:
    """The architecture of the checkpoint at ``path``, without reading tensor data."""
    return resolve_format(path, load_format).model_config(Path(path))


def load_model(config: EngineConfig, *, attention_backend: str | None = None) -> DecoderForCausalLM:
    """Build the model of ``config.model`` on ``config.device`` in ``config.dtype`` and fill
    its weights; returned in eval mode with gradients off, its dense layers on the GEMM
    backend of ``config.linear_backend``. ``attention_backend`` overrides
    ``config.attention_backend`` ("auto": triton on CUDA, torch elsewhere)."""
    dtype = torch_dtype(config.dtype)
    fmt = resolve_format(config.model, config.load_format)
    path = Path(config.model)
    model_config = fmt.model_config(path)
    model = build_model(
        model_config,
        device=config.device,
        dtype=dtype,
        attention_backend=attention_backend or config.attention_backend,
    )
    with torch.no_grad():
        fmt.load_into(model, path, seed=config.seed)
    model.eval()
    model.requires_grad_(False)
    use_linear_backend(
        model, select_linear_backend(config.linear_backend, torch.device(config.device), dtype)
    )
    return model
