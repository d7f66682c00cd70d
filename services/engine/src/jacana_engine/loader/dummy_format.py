"""Random weights with a real architecture's shapes, for benchmarks (seeded, deterministic).

The shapes come from a config.json file, an HF directory, or any checkpoint another
format can read the config of (e.g. a .gguf file). Values are chosen to keep activations
tame in bf16: matrices ~ N(0, 0.02²), norm weights 1, biases 0.
"""

from __future__ import annotations

from pathlib import Path

import torch

from jacana_engine.loader.base import WeightFormat
from jacana_engine.loader.hf_config import read_hf_config
from jacana_engine.models.base import ModelConfig
from jacana_engine.models.decoder import DecoderForCausalLM

INIT_STD = 0.02


def init_dummy_weights(model: DecoderForCausalLM, seed: int) -> None:
    """Fill every parameter in place from a generator seeded with ``seed`` on its device."""
    device = model.model.embed_tokens.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, INIT_STD, generator=gen)


class DummyFormat(WeightFormat):
    name = "dummy"

    def claims(self, path: Path) -> bool:
        # only a bare config file: a directory with weights must never load as random
        return path.is_file() and path.suffix == ".json"

    def model_config(self, path: Path) -> ModelConfig:
        if self.claims(path) or (path / "config.json").is_file():
            return read_hf_config(path)
        from jacana_engine.loader.registry import detect_format

        return detect_format(path).model_config(path)

    def load_into(self, model: DecoderForCausalLM, path: Path, *, seed: int) -> None:
        init_dummy_weights(model, seed)
