"""The tiny decoder configs that engine tests build real models from (random weights)."""

from __future__ import annotations

from jacana_engine.models.base import ModelConfig

# attention heads, KV heads, head size: two head groups of two
N_HEADS, N_KV, HEAD_DIM = 4, 2, 16


def tiny_config(architecture: str, num_layers: int, **flags) -> ModelConfig:
    """A two-head-group toy decoder of ``architecture`` (``flags``: its ModelConfig flags)."""
    return ModelConfig(
        architecture=architecture,
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=num_layers,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV,
        head_dim=HEAD_DIM,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        **flags,
    )


def tiny_qwen3() -> ModelConfig:
    """Two layers of Qwen3: GQA and the q/k norm."""
    return tiny_config("Qwen3ForCausalLM", 2, qk_norm=True)


def random_triton_qwen3(seed: int, device):
    """``tiny_qwen3`` in float32 on the Triton attention backend, weights drawn from
    N(0, 0.3) with ``seed`` (large enough that attention is far from uniform)."""
    import torch

    from jacana_engine.models.registry import build_model

    model = build_model(
        tiny_qwen3(), device=device, dtype=torch.float32, attention_backend="triton"
    )
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3, generator=gen)
    return model


def zero_kv_caches(model, num_blocks: int, block_size: int, device) -> list:
    """One zeroed [2, num_blocks, block_size, n_kv, head_dim] cache a layer of ``model``."""
    import torch

    cfg = model.config
    shape = (2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    return [torch.zeros(shape, device=device) for _ in range(cfg.num_hidden_layers)]
