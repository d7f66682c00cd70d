"""Unit tests of the decoder's layers against direct formulas (float64 where it matters)."""

from __future__ import annotations

import random

import pytest
import torch

from jacana_engine.layers.attention_backend import (
    AttentionBackend,
    attention_backends,
    get_attention_backend,
    register_attention_backend,
)
from jacana_engine.layers.linear import MergedLinear
from jacana_engine.layers.mlp import GatedMLP
from jacana_engine.layers.norm import RMSNorm
from jacana_engine.layers.ops import TorchOps
from jacana_engine.layers.paged_attention import write_kv_cache
from jacana_engine.layers.rotary import (
    RotaryEmbedding,
    apply_rotary,
    check_rope_scaling,
    rope_inv_freq,
)
from jacana_engine.models.attention import DecoderAttention
from jacana_engine.models.base import ModelConfig
from jacana_engine.worker.attention_metadata import AttentionMetadata


def test_rmsnorm_matches_formula():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 48, generator=g) * 3
    norm = RMSNorm(48, eps=1e-5)
    norm.weight.data = torch.randn(48, generator=g)
    x64 = x.double()
    want = norm.weight.double() * x64 / torch.sqrt((x64**2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x).double(), want, rtol=1e-5, atol=1e-5)
    assert norm(x.bfloat16()).dtype == torch.float32  # fp32 weight promotes, like HF


def test_rope_matches_direct_rotation():
    head_dim, theta = 32, 10000.0
    rope = RotaryEmbedding(head_dim, theta, None)
    positions = torch.tensor([0, 1, 7, 100, 4095])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(len(positions), 3, head_dim, generator=g)
    cos, sin = rope(positions, torch.float32)
    got = apply_rotary(x, cos, sin)
    # each pair (i, i + d/2) is a complex number rotated by pos * theta^(-2i/d)
    half = head_dim // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / head_dim)
    angle = positions.double()[:, None] * freq[None, :]  # [T, half]
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    z = z * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    want = torch.cat((z.real, z.imag), dim=-1)
    # fp32 angles (as in HF): pos * inv_freq loses ~pos * 6e-8 rad at large positions
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-3)
    torch.testing.assert_close(got[:3].double(), want[:3], rtol=0, atol=1e-5)
    # position 0 is the identity
    torch.testing.assert_close(got[0], x[0])


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
def test_rope_scaling_matches_transformers(scaling):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.LlamaConfig(
        hidden_size=512,
        num_attention_heads=4,
        rope_parameters={"rope_theta": 500000.0, **scaling},
    )
    want, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu")
    got = rope_inv_freq(128, 500000.0, scaling)
    assert torch.equal(got, want.float())


def test_rope_rejects_unsupported_scaling():
    with pytest.raises(ValueError, match="yarn"):
        check_rope_scaling({"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="lacks"):
        check_rope_scaling({"rope_type": "llama3", "factor": 8.0})
    check_rope_scaling(None)
    check_rope_scaling({"type": "linear", "factor": 2.0})  # legacy key


def test_merged_linear_shards_and_mlp():
    g = torch.Generator().manual_seed(2)
    lin = MergedLinear(8, {"a": 3, "b": 5}, bias=True)
    wa, wb = torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g)
    ba, bb = torch.randn(3, generator=g), torch.randn(5, generator=g)
    lin.load_shard("a", "weight", wa)
    lin.load_shard("b", "weight", wb)
    lin.load_shard("a", "bias", ba)
    lin.load_shard("b", "bias", bb)
    x = torch.randn(4, 8, generator=g)
    ya, yb = lin.split(lin(x))
    torch.testing.assert_close(ya, x @ wa.T + ba)
    torch.testing.assert_close(yb, x @ wb.T + bb)
    with pytest.raises(ValueError, match="shape"):
        lin.load_shard("a", "weight", wb)
    with pytest.raises(KeyError):
        lin.load_shard("c", "weight", wa)

    mlp = GatedMLP(8, 6)
    gate, up = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    mlp.gate_up_proj.load_shard("gate", "weight", gate)
    mlp.gate_up_proj.load_shard("up", "weight", up)
    want = mlp.down_proj(torch.nn.functional.silu(x @ gate.T) * (x @ up.T))
    torch.testing.assert_close(mlp(x), want)


def _reference_attention(q, k, v, scale):
    """Contiguous causal attention in float64; q's tokens are the last ones of k/v."""
    q_len, n_heads, _ = q.shape
    kv_len, n_kv, _ = k.shape
    group = n_heads // n_kv
    out = torch.empty(q_len, n_heads, q.shape[-1], dtype=torch.float64)
    for h in range(n_heads):
        scores = (q[:, h].double() @ k[:, h // group].double().T) * scale  # [q_len, kv_len]
        for i in range(q_len):
            visible = kv_len - q_len + i + 1
            p = torch.softmax(scores[i, :visible], dim=-1)
            out[i, h] = p @ v[:visible, h // group].double()
    return out


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_attention_matches_contiguous(block_size):
    rng = random.Random(block_size)
    g = torch.Generator().manual_seed(block_size)
    n_heads, n_kv, head_dim, num_blocks = 6, 2, 16, 64
    scale = head_dim**-0.5
    cache = torch.zeros(2, num_blocks, block_size, n_kv, head_dim)
    free = list(range(num_blocks))
    rng.shuffle(free)
    # (cached tokens, new tokens): plain prefill, decode, chunked prefill, one-token prompt
    shapes = [(0, 11), (19, 1), (9, 6), (0, 1), (block_size, 1)]
    full_k, full_v, tables = [], [], []
    for cached, new in shapes:
        n = cached + new
        full_k.append(torch.randn(n, n_kv, head_dim, generator=g))
        full_v.append(torch.randn(n, n_kv, head_dim, generator=g))
        tables.append([free.pop() for _ in range(-(-n // block_size))])

    def slots(i, start, stop):
        t = tables[i]
        return [t[p // block_size] * block_size + p % block_size for p in range(start, stop)]

    # the cached prefixes were written by earlier steps
    for i, (cached, _) in enumerate(shapes):
        if cached:
            idx = torch.tensor(slots(i, 0, cached))
            write_kv_cache(cache, full_k[i][:cached], full_v[i][:cached], idx)

    width = max(len(t) for t in tables)
    qs = [torch.randn(new, n_heads, head_dim, generator=g) for _, new in shapes]
    qlens = [new for _, new in shapes]
    slens = [c + n for c, n in shapes]
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()]).int(),
        seq_lens=torch.tensor(slens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]).int(),
        slot_mapping=torch.tensor(
            [s for i, (c, n) in enumerate(shapes) for s in slots(i, c, c + n)]
        ),
        query_lens_cpu=qlens,
        seq_lens_cpu=slens,
        block_size=block_size,
    )
    new_k = torch.cat([k[c:] for k, (c, _) in zip(full_k, shapes, strict=True)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(full_v, shapes, strict=True)])
    out = get_attention_backend("torch").forward(torch.cat(qs), new_k, new_v, cache, meta, scale)
    assert out.shape == (sum(qlens), n_heads, head_dim)
    for i, got in enumerate(out.split(qlens)):
        want = _reference_attention(qs[i], full_k[i], full_v[i], scale)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # every token's K/V landed in its slot
    flat = cache.flatten(1, 2)
    for i in range(len(shapes)):
        idx = torch.tensor(slots(i, 0, slens[i]))
        assert torch.equal(flat[0, idx], full_k[i])
        assert torch.equal(flat[1, idx], full_v[i])


def test_paged_attention_rejects_inconsistent_metadata():
    cache = torch.zeros(2, 4, 4, 1, 8)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
        seq_lens=torch.tensor([2], dtype=torch.int32),
        block_tables=torch.tensor([[0]], dtype=torch.int32),
        slot_mapping=torch.tensor([0, 1, 2]),
        query_lens_cpu=[3],
        seq_lens_cpu=[2],
        block_size=4,
    )
    q = torch.randn(3, 2, 8)
    kv = torch.randn(3, 1, 8)
    with pytest.raises(ValueError, match="exceeds"):
        get_attention_backend("torch").forward(q, kv, kv, cache, meta, 1.0)


class _Zero(AttentionBackend):
    name = "zero"

    def forward(self, q, k, v, kv_cache, meta, scale):
        return torch.zeros_like(q)


def test_attention_backend_registry():
    assert "torch" in attention_backends()
    with pytest.raises(ValueError, match="torch"):
        get_attention_backend("nope")
    with pytest.raises(ValueError, match="module:ClassName"):
        register_attention_backend("bad", "no_colon")
    register_attention_backend("test-zero", f"{__name__}:_Zero")
    try:
        assert isinstance(get_attention_backend("test-zero"), _Zero)
    finally:
        from jacana_engine.layers import attention_backend

        attention_backend._BACKENDS.pop("test-zero")


def test_default_rotate_and_store_is_rotate_then_write():
    """The base ``rotate_and_store``: rotated q/k as ``rotate`` gives them, rotated k and v
    at their slots, padding slots (< 0) skipped."""
    g = torch.Generator().manual_seed(5)
    n_heads, n_kv, head_dim, t = 4, 2, 8, 5
    rotary = RotaryEmbedding(head_dim, 10000.0, None)
    ops = TorchOps()
    tables = ops.rope_tables(rotary, torch.tensor([0, 4, 9, 2, 7]), torch.float32)
    q = torch.randn(t, n_heads, head_dim, generator=g)
    k = torch.randn(t, n_kv, head_dim, generator=g)
    v = torch.randn(t, n_kv, head_dim, generator=g)
    qw, kw = torch.randn(head_dim, generator=g), torch.randn(head_dim, generator=g)
    slots = torch.tensor([3, -1, 0, 9, 6])
    cache = torch.zeros(2, 3, 4, n_kv, head_dim)
    got_q, got_k = ops.rotate_and_store(q, k, v, tables, qw, kw, 1e-6, cache, slots)
    want_q, want_k = ops.rotate(q, k, tables, qw, kw, 1e-6)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    flat = cache.flatten(1, 2)  # [2, 12, n_kv, head_dim]
    real = slots >= 0
    assert torch.equal(flat[0, slots[real]], want_k[real])
    assert torch.equal(flat[1, slots[real]], v[real])
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[slots[real]] = False
    assert not flat[:, untouched].any()


class _RecordingBackend(AttentionBackend):
    """Torch attention that records whether it was told the KV was already written."""

    name = "recording"
    accepts_written_kv = True

    def __init__(self) -> None:
        self.inner = get_attention_backend("torch")
        self.calls: list[bool] = []

    def forward(self, q, k, v, kv_cache, meta, scale, kv_written=False):
        self.calls.append(kv_written)
        return self.inner.forward(q, k, v, kv_cache, meta, scale, kv_written)


class _FusingTorchOps(TorchOps):
    """Claims a fused store (through the base default) to exercise the layer's choice."""

    fuses_kv_store = True


def _tiny_attention_config() -> ModelConfig:
    return ModelConfig(
        architecture="Qwen3ForCausalLM",
        vocab_size=32,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        qk_norm=True,
    )


@pytest.mark.parametrize(
    ("ops", "accepts", "fused"),
    [(TorchOps, True, False), (_FusingTorchOps, False, False), (_FusingTorchOps, True, True)],
)
def test_attention_stores_kv_in_rope_only_when_both_sides_can(ops, accepts, fused):
    """The fused rotate-and-store path needs ops that fuse and a backend that accepts
    written KV; either way the layer's output and cache are the same."""
    cfg = _tiny_attention_config()
    g = torch.Generator().manual_seed(6)
    backend = _RecordingBackend()
    backend.accepts_written_kv = accepts
    layer = DecoderAttention(cfg, backend, ops())
    plain = DecoderAttention(cfg, get_attention_backend("torch"), TorchOps())
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    plain.load_state_dict(layer.state_dict())
    rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, None)
    positions = torch.tensor([0, 1, 2, 5])  # a 3-token prompt, and a decode at position 5
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 3, 4], dtype=torch.int32),
        seq_lens=torch.tensor([3, 6], dtype=torch.int32),
        block_tables=torch.tensor([[2, 0], [1, 3]], dtype=torch.int32),
        slot_mapping=torch.tensor([8, 9, 10, 13]),
        query_lens_cpu=[3, 1],
        seq_lens_cpu=[3, 6],
        block_size=4,
    )
    x = torch.randn(4, cfg.hidden_size, generator=g)
    cache = torch.randn(2, 4, 4, cfg.num_key_value_heads, cfg.head_dim, generator=g)
    want_cache = cache.clone()
    tables = TorchOps().rope_tables(rotary, positions, x.dtype)
    with torch.no_grad():
        got = layer(x, tables, cache, meta)
        want = plain(x, tables, want_cache, meta)
    assert backend.calls == [fused]
    assert torch.equal(got, want)
    assert torch.equal(cache, want_cache)
