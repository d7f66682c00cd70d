"""GGUF checkpoints (llama.cpp): dequantize each tensor and copy it into the model.

Tensor data is located through our own header reader (``gguf_metadata``) in a read-only
memory map and dequantized one tensor at a time with ``gguf.quants.dequantize``, which
covers every ggml type the ``gguf`` package knows (F32/F16/BF16, Q4_0..Q8_0, the K-quants,
the i-quants); the float32 host array lives only until it is copied into its parameter
(which casts to the model dtype and device). ``gguf.GGUFReader`` is not used: it parses the
whole metadata (a 151k-token vocabulary and its merges) element by element, which costs
more than dequantizing the weights.

llama.cpp's converter permutes the rows of Llama's Q and K projections (to interleave the
rotary pairs); ``unpermute_qk`` undoes it exactly as HF transformers does.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from jacana_engine.loader.base import WeightFormat
from jacana_engine.loader.gguf_config import model_config_from_gguf
from jacana_engine.loader.gguf_metadata import GGUFTensorInfo, read_gguf_header
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
    permuted = get_arch_spec(config.architecture).gguf_permuted_qk
    # GGUF block tensor part -> heads whose rows llama.cpp permuted
    qk_heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    header = read_gguf_header(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        data = np.frombuffer(mm, dtype=np.uint8)  # the whole file, read-only, no copy
        try:
            for t in header.tensors:
                tensor = torch.from_numpy(dequantize_tensor(data, header.data_offset, t))
                part = t.name.split(".")[2] if t.name.startswith("blk.") else None
                if permuted and part in qk_heads:
                    tensor = unpermute_qk(tensor, qk_heads[part])
                yield hf_name(t.name), tensor
        finally:
            del data  # the memory map cannot close while an array still views it


def dequantize_tensor(data: np.ndarray, data_offset: int, t: GGUFTensorInfo) -> np.ndarray:
    """Tensor ``t`` of the file bytes ``data`` as a writable float32 array of ``t.shape``."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quant_shape_to_byte_shape

    qtype = GGMLQuantizationType(t.ggml_type)
    # rows of packed blocks: [..., blocks per row * bytes per block]
    byte_shape = quant_shape_to_byte_shape(t.shape, qtype)
    start = data_offset + t.offset
    raw = data[start : start + math.prod(byte_shape)].reshape(byte_shape)
    array = dequantize(raw, qtype)
    if not array.flags.writeable or array.dtype != np.float32:
        array = np.array(array, dtype=np.float32)  # F32 comes back as a view of the file
    return array.reshape(t.shape)


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
