"""The weight-format interface: find a checkpoint's config and fill a built model from it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from jacana_engine.models.base import ModelConfig
from jacana_engine.models.decoder import DecoderForCausalLM


class WeightFormat(ABC):
    """One on-disk checkpoint format (GGUF, safetensors, random "dummy" weights)."""

    name: str

    @abstractmethod
    def claims(self, path: Path) -> bool:
        """Whether ``load_format="auto"`` should pick this format for ``path``."""

    @abstractmethod
    def model_config(self, path: Path) -> ModelConfig:
        """The architecture of the checkpoint at ``path``, read cheaply (no tensor data)."""

    @abstractmethod
    def load_into(self, model: DecoderForCausalLM, path: Path, *, seed: int) -> None:
        """Fill every parameter of ``model`` (already on its device and dtype), tensor by
        tensor, so no second copy of the model is ever resident."""
