"""Engine configuration: one frozen dataclass handed to every engine component.

``EngineConfig`` is what the engine core reads; the service's environment settings
(``settings.py``) are translated into it once at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    """How to load and run one model.

    model: a ``.gguf`` file, a Hugging Face directory (config.json + *.safetensors), or for
        ``load_format="dummy"`` a config.json path / HF directory whose shapes are used with
        random weights.
    model_id: the name clients use for this model.
    load_format: "auto" (from the path), "gguf", "safetensors" or "dummy".
    dtype: compute dtype, "float32" | "bfloat16" | "float16".
    device: torch device string, "cpu" or "cuda[:N]".
    block_size: tokens per KV-cache block.
    num_kv_blocks: size of the block pool; None derives it from ``kv_cache_memory_bytes``.
    kv_cache_memory_bytes: byte budget for the KV pool when ``num_kv_blocks`` is None.
    max_model_len: prompt + completion limit; None uses the model's own.
    max_num_seqs: most sequences in one step (running batch size).
    max_num_batched_tokens: token budget of one step (prefill chunks + decodes).
    seed: seed for requests that bring none and for dummy weights.
    """

    model: str
    model_id: str = "model"
    load_format: str = "auto"
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int = 512 * 1024 * 1024
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    seed: int = 0
