"""Our BERT-family encoder against HF transformers on the same weights.

Tiny random configurations cover each registered family (BERT, RoBERTa, XLM-R) and the
checkpoint spellings (task-model prefixes, TF-era gamma/beta); the real MiniLM weights
cover the served default. The reference runs in float32 eager mode.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from jacana_common.linear_backends import select_linear_backend
from jacana_embeddings.encoders import ENCODER_FAMILIES, load_encoder, resolve_family
from jacana_embeddings.errors import ModelLoadError
from jacana_embeddings.varlen import PackedLayout, PaddedLayout, grid_positions

CPU = torch.device("cpu")
TINY = dict(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)


def _batch(vocab: int, pad: int, lengths=(9, 3, 17, 1)) -> tuple[torch.Tensor, torch.Tensor]:
    # ids: [B, S] right-padded with ``pad``; mask: [B, S] bool
    g = torch.Generator().manual_seed(0)
    longest = max(lengths)
    ids = torch.full((len(lengths), longest), pad, dtype=torch.long)
    mask = torch.zeros(len(lengths), longest, dtype=torch.bool)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(pad + 1, vocab, (n,), generator=g)
        mask[row, :n] = True
    return ids, mask


def _save_random(kind: str, path: Path, **extra) -> torch.nn.Module:
    import transformers

    config_cls, model_cls = {
        "bert": (transformers.BertConfig, transformers.BertModel),
        "bert-mlm": (transformers.BertConfig, transformers.BertForMaskedLM),
        "roberta": (transformers.RobertaConfig, transformers.RobertaModel),
        "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaModel),
    }[kind]
    torch.manual_seed(1)
    config = config_cls(**TINY, **extra, attn_implementation="eager")
    model = model_cls(config).eval()
    model.save_pretrained(path)
    return model


def _reference_hidden(model, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True)
    return out.hidden_states[-1]  # [B, S, H]


@pytest.mark.parametrize("dense", ["torch", "auto"])
@pytest.mark.parametrize("kind", ["bert", "bert-mlm", "roberta", "xlm-roberta"])
def test_tiny_random_encoders_match_transformers(kind, dense, tmp_path):
    extra = {"pad_token_id": 1} if "roberta" in kind else {}
    model = _save_random(kind, tmp_path, **extra)
    arch, ours = load_encoder(tmp_path, torch.float32, CPU)
    ours.dense = select_linear_backend(dense, CPU, torch.float32)
    assert arch == model.config.architectures[0]
    ids, mask = _batch(TINY["vocab_size"], extra.get("pad_token_id", 0))
    expected = _reference_hidden(model, ids, mask)
    got = ours(ids, mask)
    torch.testing.assert_close(got[mask], expected[mask], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_padded_grid_gives_the_packed_hidden_states(kind, tmp_path):
    # The CUDA-graph path (encoder_graphs.py) runs a fixed [rows, length] grid with filler
    # rows; its real tokens must come out as the packed path gives them.
    pad = 1 if kind == "roberta" else 0
    _save_random(kind, tmp_path, pad_token_id=pad)
    _, encoder = load_encoder(tmp_path, torch.float32, CPU)
    lengths = [9, 3, 17, 1]
    g = torch.Generator().manual_seed(1)
    flat = torch.randint(pad + 1, TINY["vocab_size"], (sum(lengths),), generator=g)  # [T]
    expected = encoder.forward_packed(flat, PackedLayout(lengths, CPU))

    rows, length = 6, 32  # two filler rows, padding in every row
    where = torch.from_numpy(grid_positions(lengths, length))  # [T]: grid cell of each
    grid = torch.full((rows * length,), pad, dtype=torch.int64)
    grid[where] = flat
    layout = PaddedLayout(rows, length, torch.tensor([*lengths, 1, 1]))
    layout.refresh()
    got = encoder.forward_packed(grid, layout)  # [rows * length, H]
    torch.testing.assert_close(got[where], expected, atol=2e-5, rtol=1e-4)
    assert torch.isfinite(got).all()  # filler rows and padding stay finite


def test_legacy_gamma_beta_names(tmp_path):
    model = _save_random("bert", tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    renamed = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): v
        for k, v in weights.items()
    }
    save_file(renamed, str(tmp_path / "model.safetensors"))
    _, ours = load_encoder(tmp_path, torch.float32, CPU)
    ids, mask = _batch(TINY["vocab_size"], 0)
    torch.testing.assert_close(
        ours(ids, mask)[mask], _reference_hidden(model, ids, mask)[mask], atol=2e-5, rtol=1e-4
    )


@pytest.mark.parametrize("dense", ["torch", "auto"])
def test_minilm_hidden_states_match_transformers(model_dir, dense):
    from transformers import AutoModel

    ref = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    _, ours = load_encoder(model_dir, torch.float32, CPU)
    ours.dense = select_linear_backend(dense, CPU, torch.float32)
    ids, mask = _batch(30522, 0, lengths=(40, 7, 128, 2))
    ids[:, 0] = 101  # [CLS]
    torch.testing.assert_close(
        ours(ids, mask)[mask], _reference_hidden(ref, ids, mask)[mask], atol=1e-4, rtol=1e-4
    )


def test_missing_weight_is_named(tmp_path):
    _save_random("bert", tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    del weights["encoder.layer.1.output.dense.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"layers\.1\.mlp_out\.weight"):
        load_encoder(tmp_path, torch.float32, CPU)


def test_misshapen_weight_is_named(tmp_path):
    _save_random("bert", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["intermediate_size"] = 48
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="shape"):
        load_encoder(tmp_path, torch.float32, CPU)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"architectures": ["LlamaForCausalLM"]}, "unsupported encoder architecture"),
        ({"model_type": "gpt2"}, "unsupported encoder architecture"),
    ],
)
def test_unsupported_architectures(config, message):
    with pytest.raises(ModelLoadError, match=message):
        resolve_family(config)


def test_family_by_model_type_when_no_architecture():
    assert resolve_family({"model_type": "bert"})[1] is ENCODER_FAMILIES["BertModel"]


def test_relative_positions_are_refused(tmp_path):
    _save_random("bert", tmp_path, position_embedding_type="relative_key")
    with pytest.raises(ModelLoadError, match="position_embedding_type"):
        load_encoder(tmp_path, torch.float32, CPU)


def test_no_weights(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["BertModel"], **TINY, "num_attention_heads": 4})
    )
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_encoder(tmp_path, torch.float32, CPU)
