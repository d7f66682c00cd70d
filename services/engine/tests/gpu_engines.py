"""Helpers of the GPU engine tests: a small bf16 CUDA engine (and engines that differ in
one setting, on one tuning cache), a check that two engines give the same outputs, and a
tiny Llama's config for ``load_format="dummy"`` engines."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jacana_engine.config import EngineConfig
from jacana_engine.core.engine import LLMEngine
from jacana_engine.sample.params import SamplingParams

# A 4-layer Llama (GQA 8/2, 512 wide): big enough for several KV blocks per sequence and a
# measurable weight footprint, small enough to load in a moment. Written as config.json.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 4096,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def small_cuda_engine(model: str, *, tokenizer: Any = "default", **config: Any) -> LLMEngine:
    """An engine on ``model`` in bfloat16 on CUDA with a 1 GiB KV pool, 1024-token
    sequences and 16 at a time, its one-row decode GEMMs left at the chain tuner's picks
    (``tune_in_graph`` off: ~100 graph captures a start; the parity tests turn it on);
    ``config`` overrides or adds ``EngineConfig`` fields, ``tokenizer=None`` runs on
    token ids alone."""
    settings = dict(
        model=model,
        dtype="bfloat16",
        device="cuda",
        kv_cache_memory=1 << 30,
        max_model_len=1024,
        max_num_seqs=16,
        tune_in_graph=False,
    )
    engine_config = EngineConfig(**{**settings, **config})
    if tokenizer == "default":
        return LLMEngine(engine_config)
    return LLMEngine(engine_config, tokenizer=tokenizer)


def engines_differing_in(
    field: str, values: tuple, model: str, cache_dir: Path, **config: Any
) -> tuple[LLMEngine, ...]:
    """One ``small_cuda_engine`` per value of ``EngineConfig.field``, all on one tuning
    cache in ``cache_dir`` (the first times the decode GEMMs, the rest read its picks), so
    they run the same decode GEMMs: each timing its own may pick another config for a
    near-equal pair, which changes low bits and, at a near-tie, a token."""
    cache = str(Path(cache_dir) / "decode_gemm_tuning.json")
    return tuple(
        small_cuda_engine(model, tuning_cache=cache, **{**config, field: value}) for value in values
    )


def assert_same_outputs(engine: LLMEngine, reference: LLMEngine, prompts: list[list[int]]):
    """Greedy and seeded (device-sampled) outputs of ``engine`` equal ``reference``'s for
    8 requests of different lengths, so the batch shrinks while steps are in flight."""
    for sp in (
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=40, seed=3, max_tokens=40, ignore_eos=True),
    ):
        params = [SamplingParams(**{**sp.__dict__, "max_tokens": 8 + 4 * i}) for i in range(8)]
        assert engine.generate(prompts, params) == reference.generate(prompts, params), sp


SMOL_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 5, 8, 13,",
    "Water boils at",
    "The three primary colors are red,",
    "import numpy as np\nimport torch\n\nclass Model(torch.nn.Module):",
    "My favourite book is",
]


def smollm2_gguf() -> Path | None:
    env = os.environ.get("JACANA_SMOLLM2_GGUF")
    if env:
        return Path(env) if Path(env).is_file() else None
    from jacana_engine.assets.default_model import default_model_path

    return default_model_path()
