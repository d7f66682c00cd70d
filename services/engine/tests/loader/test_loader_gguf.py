"""GGUF loading on small synthetic files: every supported tensor type, the Llama Q/K
un-permutation, Qwen2 biases and Qwen3 q/k norms — checked against transformers loading
the same file, and the header reader against ``gguf.GGUFReader``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from jacana_engine.config import EngineConfig
from jacana_engine.loader import get_model_config, load_model, read_gguf_metadata
from jacana_engine.loader.gguf_format import unpermute_qk
from jacana_engine.loader.gguf_metadata import read_gguf_header

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
pytestmark = pytest.mark.usefixtures("torch_one_thread")

HIDDEN, FFN, VOCAB, HEADS, KV_HEADS, LAYERS = 256, 256, 96, 4, 2, 2
# Qwen3 stores head_dim explicitly (attention.key_length) and it need not be hidden/heads;
# transformers' GGUF path keeps Qwen3's default of 128, so use that
HEAD_DIMS = {"llama": HIDDEN // HEADS, "qwen2": HIDDEN // HEADS, "qwen3": 128}

# per layer: GGUF tensor suffix -> storage type; together they cover every supported type
LAYER_TYPES = [
    {
        "attn_q": Q.Q4_K,
        "attn_k": Q.Q5_K,
        "attn_v": Q.Q6_K,
        "attn_output": Q.Q4_0,
        "ffn_gate": Q.Q4_1,
        "ffn_up": Q.F16,
        "ffn_down": Q.BF16,
    },
    {
        "attn_q": Q.F16,
        "attn_k": Q.Q8_0,
        "attn_v": Q.Q5_0,  # Q4_K_M files keep some tensors in Q5_0
        "attn_output": Q.Q5_K,
        "ffn_gate": Q.Q6_K,
        "ffn_up": Q.Q5_1,
        "ffn_down": Q.F32,
    },
]
# f16 scale fields of K-quant blocks: (byte offset, value) keeping weights around 0.1
_K_SCALES = {
    Q.Q4_K: [(0, 2e-4), (2, 1e-4)],
    Q.Q5_K: [(0, 1e-4), (2, 1e-4)],
    Q.Q6_K: [(-2, 3e-5)],
}


def _encode(rng: np.random.Generator, shape: tuple[int, int], qtype) -> np.ndarray:
    """Random weights of ``shape`` stored as ``qtype`` (K-quants as random valid blocks)."""
    if qtype in _K_SCALES:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (shape[0], shape[1] // block, size), dtype=np.uint8)
        for offset, value in _K_SCALES[qtype]:
            f16 = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
            end = offset + 2 if offset != -2 else None
            blocks[:, :, offset:end] = f16
        return blocks.reshape(shape[0], -1)
    w = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    if qtype == Q.F32:
        return w
    if qtype == Q.F16:
        return w.astype(np.float16)
    return gguf.quants.quantize(w, qtype)


def _write_gguf(path, arch: str, *, rope_theta: float = 10000.0) -> None:
    rng = np.random.default_rng(0)
    head_dim = HEAD_DIMS[arch]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(rope_theta)
    w.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(VOCAB)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def add(name: str, shape: tuple[int, ...], qtype) -> None:
        if len(shape) == 1:
            data = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            w.add_tensor(name, data)
            return
        data = _encode(rng, shape, qtype)
        w.add_tensor(name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)

    add("token_embd.weight", (VOCAB, HIDDEN), Q.Q8_0)
    add("output_norm.weight", (HIDDEN,), Q.F32)
    add("output.weight", (VOCAB, HIDDEN), Q.Q6_K)
    out_rows = {"attn_q": HEADS * head_dim, "attn_k": KV_HEADS * head_dim}
    out_rows |= {"attn_v": KV_HEADS * head_dim, "attn_output": HIDDEN}
    out_rows |= {"ffn_gate": FFN, "ffn_up": FFN, "ffn_down": HIDDEN}
    for i, types in enumerate(LAYER_TYPES):
        add(f"blk.{i}.attn_norm.weight", (HIDDEN,), Q.F32)
        add(f"blk.{i}.ffn_norm.weight", (HIDDEN,), Q.F32)
        for part, qtype in types.items():
            cols = {"ffn_down": FFN, "attn_output": HEADS * head_dim}.get(part, HIDDEN)
            add(f"blk.{i}.{part}.weight", (out_rows[part], cols), qtype)
        if arch == "qwen2":
            for part in ("attn_q", "attn_k", "attn_v"):
                bias = (0.1 * rng.standard_normal(out_rows[part])).astype(np.float32)
                w.add_tensor(f"blk.{i}.{part}.bias", bias)
        if arch == "qwen3":
            add(f"blk.{i}.attn_q_norm.weight", (head_dim,), Q.F32)
            add(f"blk.{i}.attn_k_norm.weight", (head_dim,), Q.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def gguf_file(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / f"tiny-{request.param}.gguf"
    _write_gguf(path, request.param)
    return path


@pytest.fixture(scope="module")
def hf_reference(gguf_file):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    ).eval()


def test_config_from_gguf(gguf_file):
    cfg = get_model_config(gguf_file)
    arch = gguf_file.stem.removeprefix("tiny-")
    want = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    assert cfg.architecture == want[arch]
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (HIDDEN, FFN, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (HEADS, KV_HEADS)
    assert cfg.head_dim == HEAD_DIMS[arch]
    assert cfg.vocab_size == VOCAB and not cfg.tie_word_embeddings
    assert cfg.attention_bias == (arch == "qwen2") and cfg.qk_norm == (arch == "qwen3")
    assert cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,)
    # a directory holding one .gguf resolves to it
    assert get_model_config(gguf_file.parent) == cfg


def test_weights_and_logits_match_transformers(gguf_file, hf_reference, paged_driver):
    ours = load_model(EngineConfig(model=str(gguf_file)))
    ref = dict(hf_reference.named_parameters())
    for i in range(LAYERS):
        attn = ours.model.layers[i].self_attn
        q, k, v = attn.qkv_proj.split(attn.qkv_proj.weight.T)
        for name, got in (("q_proj", q.T), ("k_proj", k.T), ("v_proj", v.T)):
            assert torch.equal(got, ref[f"model.layers.{i}.self_attn.{name}.weight"]), name
        gate, up = ours.model.layers[i].mlp.gate_up_proj.split(
            ours.model.layers[i].mlp.gate_up_proj.weight.T
        )
        assert torch.equal(gate.T, ref[f"model.layers.{i}.mlp.gate_proj.weight"])
        assert torch.equal(up.T, ref[f"model.layers.{i}.mlp.up_proj.weight"])
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            got = dict(ours.named_parameters())[f"model.layers.{i}.{name}"]
            assert torch.equal(got, ref[f"model.layers.{i}.{name}"]), name
    assert torch.equal(ours.lm_head.weight, ref["lm_head.weight"])
    assert all(torch.isfinite(p).all() for p in ours.parameters())

    ids = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 8, 41]
    (logits,) = paged_driver(ours, block_size=8).step([(0, ids)])
    with torch.inference_mode():
        want = hf_reference(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)


def test_unpermute_inverts_llama_cpp_permutation():
    def permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
        # llama.cpp convert_hf_to_gguf: rows per head go from (2, half) to (half, 2)
        return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2)

    w = torch.randn(6 * 8, 5)
    assert torch.equal(unpermute_qk(permute(w, 6).reshape(w.shape), 6), w)
    b = torch.randn(2 * 16)
    assert torch.equal(unpermute_qk(permute(b, 2).reshape(b.shape), 2), b)
    assert not torch.equal(unpermute_qk(w, 6), w)


def test_header_reader_matches_gguf_reader(gguf_file):
    header = read_gguf_header(gguf_file)
    reader = gguf.GGUFReader(gguf_file)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert header.metadata == fields
    assert read_gguf_metadata(gguf_file) == fields
    assert header.data_offset == reader.data_offset
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(header.tensors, reader.tensors, strict=True):
        assert ours.shape == tuple(int(d) for d in reversed(theirs.shape))
        assert ours.ggml_type == theirs.tensor_type
        assert header.data_offset + ours.offset == theirs.data_offset


def test_rejects_unsupported_gguf(tmp_path):
    path = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(path), "phi2")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="phi2"):
        get_model_config(path)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="magic"):
        read_gguf_metadata(bad)


def test_every_tensor_type_dequantizes_like_gguf_reader(tmp_path):
    """Our header + memory map locate and dequantize each type exactly as GGUFReader does."""
    from jacana_engine.loader.gguf_format import dequantize_tensor

    types = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
    types += [Q.Q4_K, Q.Q5_K, Q.Q6_K]
    path = tmp_path / "types.gguf"
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), "llama")
    for qtype in types:
        data = _encode(rng, (8, 512), qtype)
        w.add_tensor(qtype.name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    header = read_gguf_header(path)
    data = np.fromfile(path, dtype=np.uint8)
    reader = gguf.GGUFReader(path)
    for ours, theirs in zip(header.tensors, reader.tensors, strict=True):
        got = dequantize_tensor(data, header.data_offset, ours)
        want = gguf.quants.dequantize(theirs.data, theirs.tensor_type)
        assert got.dtype == np.float32 and got.shape == (8, 512), ours.name
        np.testing.assert_array_equal(got, want.reshape(8, 512), err_msg=ours.name)
        assert np.isfinite(got).all() and got.std() > 0, ours.name
