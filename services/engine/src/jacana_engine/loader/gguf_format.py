"""GGUF checkpoints (llama.cpp): dequantize each tensor and copy it into the model.

Tensors are read through ``gguf.GGUFReader`` (memory-mapped) and dequantized one at a
time with ``gguf.quants.dequantize`` to a float32 host array that lives only until it is
copied into its parameter (which casts to the model dtype and device).

llama.cpp's converter permutes the rows of Llama's Q and K projections (to interleave the
rotary pairs); ``unpermute_qk`` undoes it exactly as HF transformers does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from jacana_engine.loader.base import WeightFormat
from jacana_engine.loader.gguf_config import model_config_from_gguf
from jacana_engine.loader.gguf_metadata import read_gguf_header
from jacana_engine.loader.gguf_names import hf_name
from jacana_engine.models.base import ModelConfig
from jacana_engine.models.decoder import DecoderForCausalLM
from jacana_engine.models.registry import get_arch_spec


def resolve_gguf_file(path: Path) -> Path:
    """``path`` itself, or the single .gguf file inside directory ``path``."""
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise ValueError(f"{path} holds {len(found)} .gguf files; name one")
        return found[0]
    return path


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation. w: [n_heads * head_dim, ...] (weight or bias)."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    # llama.cpp stored rows per head as (half, 2); HF wants (2, half)
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def iter_gguf_weights(path: Path, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, float32 host tensor) for every tensor, one dequantized at a time."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    permuted = get_arch_spec(config.architecture).gguf_permuted_qk
    # GGUF block tensor part -> heads whose rows llama.cpp permuted
    qk_heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    reader = GGUFReader(path)
    for t in reader.tensors:
        name = hf_name(t.name)
        array = dequantize(t.data, t.tensor_type)
        if not array.flags.writeable:
            array = np.array(array)  # F32 tensors come back as read-only views of the file
        tensor = torch.from_numpy(array).reshape(tuple(int(d) for d in reversed(t.shape)))
        part = t.name.split(".")[2] if t.name.startswith("blk.") else None
        if permuted and part in qk_heads:
            tensor = unpermute_qk(tensor, qk_heads[part])
        yield name, tensor


class GGUFFormat(WeightFormat):
    name = "gguf"

    def claims(self, path: Path) -> bool:
        if path.is_dir():
            return not any(path.glob("*.safetensors")) and len(list(path.glob("*.gguf"))) == 1
        return path.suffix == ".gguf"

    def model_config(self, path: Path) -> ModelConfig:
        return model_config_from_gguf(read_gguf_header(resolve_gguf_file(path)))

    def load_into(self, model: DecoderForCausalLM, path: Path, *, seed: int) -> None:
        model.load_weights(iter_gguf_weights(resolve_gguf_file(path), model.config))
