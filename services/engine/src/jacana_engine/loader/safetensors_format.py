"""HF checkpoints: a directory with config.json and one or more *.safetensors files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from jacana_engine.loader.base import WeightFormat
from jacana_engine.loader.hf_config import read_hf_config
from jacana_engine.models.base import ModelConfig
from jacana_engine.models.decoder import DecoderForCausalLM

INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(directory: Path) -> list[Path]:
    """The shards named by the index file, else every *.safetensors in the directory."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [directory / f for f in sorted(set(weight_map.values()))]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    return files


def iter_safetensors_weights(
    directory: Path, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) one tensor at a time, read straight onto ``device``."""
    from safetensors import safe_open

    for file in safetensors_files(directory):
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_tensor(name)


class SafetensorsFormat(WeightFormat):
    name = "safetensors"

    def claims(self, path: Path) -> bool:
        return (
            path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))
        )

    def model_config(self, path: Path) -> ModelConfig:
        return read_hf_config(path)

    def load_into(self, model: DecoderForCausalLM, path: Path, *, seed: int) -> None:
        device = model.model.embed_tokens.weight.device
        model.load_weights(iter_safetensors_weights(path, device))
