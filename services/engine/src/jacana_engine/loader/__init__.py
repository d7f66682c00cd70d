"""Checkpoint loading: GGUF, HF safetensors and dummy weights behind one interface."""

from jacana_engine.loader.gguf_metadata import read_gguf_metadata
from jacana_engine.loader.load import get_model_config, load_model, torch_dtype

__all__ = ["get_model_config", "load_model", "read_gguf_metadata", "torch_dtype"]
