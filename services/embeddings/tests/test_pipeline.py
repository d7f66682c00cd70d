"""The sentence-transformers pipeline read from a model directory: pooling modes, Dense,
LayerNorm and Normalize modules, overrides, Matryoshka dimensions from the model card.

Pipelines are built and saved by sentence-transformers itself around a tiny random BERT
(with the MiniLM tokenizer), then loaded by both: the vectors must agree.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from jacana_embeddings.config import EmbedderConfig
from jacana_embeddings.embedder import Embedder
from jacana_embeddings.errors import ModelLoadError
from jacana_embeddings.model_spec import pooling_modes_from_config, read_pipeline
from jacana_embeddings.pooling import POOLING_STRATEGIES, Pooling

TEXTS = [
    "Hello world",
    "A much longer sentence with many more tokens than the first.",
    "x",
    "Ünïcödé 東京 🙂",
    "padding " * 20,
]
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


@pytest.fixture
def tiny_bert(tmp_path, model_dir) -> Path:
    import transformers

    torch.manual_seed(3)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    path = tmp_path / "tiny-bert"
    transformers.BertModel(config).save_pretrained(path)
    for name in _TOKENIZER_FILES:
        shutil.copy(model_dir / name, path / name)
    return path


def _st_pipeline(tiny_bert: Path, out: Path, pooling, extra: list[str]) -> object:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        LayerNorm,
        Normalize,
        Transformer,
    )
    from sentence_transformers.sentence_transformer.modules import (
        Pooling as STPooling,
    )

    torch.manual_seed(4)
    modules = [Transformer(str(tiny_bert), max_seq_length=64), STPooling(32, pooling)]
    dim = 32 * (1 if isinstance(pooling, str) else len(pooling))
    for kind in extra:
        if kind == "dense":
            modules.append(Dense(dim, 24, activation_function=torch.nn.Tanh()))
            dim = 24
        elif kind == "layernorm":
            modules.append(LayerNorm(dim))
            torch.nn.init.normal_(modules[-1].norm.weight)
        elif kind == "normalize":
            modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu")
    model.save(str(out))
    return model


@pytest.mark.parametrize(
    "pooling, extra",
    [
        ("mean", ["normalize"]),
        ("cls", []),
        ("max", ["normalize"]),
        ("mean_sqrt_len_tokens", []),
        ("weightedmean", []),
        ("lasttoken", []),
        (("mean", "max"), ["normalize"]),
        ("mean", ["dense", "normalize"]),
        ("cls", ["layernorm"]),
    ],
)
def test_pipeline_matches_sentence_transformers(tiny_bert, tmp_path, pooling, extra):
    out = tmp_path / "st-model"
    reference = _st_pipeline(tiny_bert, out, pooling, extra)
    ours = Embedder(EmbedderConfig(model_dir=out, model_id="tiny"))
    expected = reference.encode(TEXTS, convert_to_numpy=True)
    encoded = ours.tokenize(TEXTS, truncate=True)
    got = ours.embed([ids for ids, _ in encoded])
    assert got.shape == expected.shape == (len(TEXTS), ours.info.dimension)
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-4)
    assert ours.info.normalized == ("normalize" in extra)
    assert ours.info.max_input_tokens == 64


def test_default_model_spec(model_dir):
    spec = read_pipeline(model_dir)
    assert spec.pooling_modes == ("mean",)
    assert [kind for kind, _ in spec.heads] == ["Normalize"]
    assert spec.normalizes and spec.max_seq_length == 256 and not spec.do_lower_case
    assert spec.matryoshka_dims == ()


def test_plain_hf_directory_gets_mean_pooling_without_normalization(tiny_bert):
    ours = Embedder(EmbedderConfig(model_dir=tiny_bert, model_id="tiny"))
    assert ours.info.pooling == "mean" and not ours.info.normalized
    assert ours.info.max_input_tokens == 128  # the position table


def test_overrides(tiny_bert):
    config = EmbedderConfig(
        model_dir=tiny_bert,
        model_id="tiny",
        pooling=("cls", "max"),
        normalize=True,
        max_input_tokens=16,
        matryoshka_dims=(32, 16),
    )
    ours = Embedder(config)
    assert ours.info.pooling == "cls+max" and ours.info.dimension == 64
    assert ours.info.normalized and ours.info.max_input_tokens == 16
    assert ours.info.matryoshka_dims == (32, 16)
    (vec,) = ours.embed([ours.tokenize(["hello"], truncate=False)[0][0]])
    assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-5


def test_max_input_tokens_beyond_position_table_is_refused(tiny_bert):
    with pytest.raises(ModelLoadError, match="position table"):
        Embedder(EmbedderConfig(model_dir=tiny_bert, model_id="t", max_input_tokens=129))


def test_matryoshka_dims_outside_dimension_are_refused(tiny_bert):
    with pytest.raises(ModelLoadError, match="Matryoshka"):
        Embedder(EmbedderConfig(model_dir=tiny_bert, model_id="t", matryoshka_dims=(64,)))


def test_matryoshka_dims_from_model_card(tiny_bert):
    (tiny_bert / "README.md").write_text(
        'loss: MatryoshkaLoss\n```json\n{\n    "loss": "MultipleNegativesRankingLoss",\n'
        '    "matryoshka_dims": [\n        32,\n        8,\n        16\n    ]\n}\n```\n'
    )
    assert read_pipeline(tiny_bert).matryoshka_dims == (32, 16, 8)
    ours = Embedder(EmbedderConfig(model_dir=tiny_bert, model_id="tiny"))
    assert ours.info.supports_matryoshka and ours.info.matryoshka_dims == (32, 16, 8)
    off = Embedder(EmbedderConfig(model_dir=tiny_bert, model_id="tiny", matryoshka_dims=()))
    assert not off.info.supports_matryoshka


@pytest.mark.parametrize(
    "config, modes",
    [
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, ("mean",)),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, ("cls", "mean")),
        ({"pooling_mode_lasttoken": True}, ("lasttoken",)),
        ({"word_embedding_dimension": 8}, ("mean",)),
        ({"pooling_mode": "cls"}, ("cls",)),
        ({"pooling_mode": ["max", "mean"]}, ("max", "mean")),
    ],
)
def test_pooling_config_spellings(config, modes):
    assert pooling_modes_from_config(config) == modes


def test_unknown_pooling_mode_is_refused():
    with pytest.raises(ModelLoadError, match="pooling"):
        pooling_modes_from_config({"pooling_mode": "median"})
    with pytest.raises(ValueError, match="unknown pooling"):
        Pooling(["median"])


def test_unsupported_module_is_refused(tmp_path):
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_CNN", "type": "sentence_transformers.models.CNN"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match="CNN"):
        read_pipeline(tmp_path)


def test_pooling_strategies_on_known_values():
    # hidden: [B=2, S=3, H=2]; row 0 has 2 real tokens, row 1 has 3
    hidden = torch.tensor(
        [[[1.0, 2.0], [3.0, 6.0], [100.0, 100.0]], [[1.0, 0.0], [2.0, 0.0], [6.0, 3.0]]]
    )
    mask = torch.tensor([[True, True, False], [True, True, True]])
    expected = {
        "cls": [[1, 2], [1, 0]],
        "lasttoken": [[3, 6], [6, 3]],
        "max": [[3, 6], [6, 3]],
        "mean": [[2, 4], [3, 1]],
        "mean_sqrt_len_tokens": [[4 / 2**0.5, 8 / 2**0.5], [9 / 3**0.5, 3 / 3**0.5]],
        "weightedmean": [[7 / 3, 14 / 3], [23 / 6, 9 / 6]],
    }
    assert set(expected) == set(POOLING_STRATEGIES)
    for name, values in expected.items():
        got = Pooling([name])(hidden, mask)
        torch.testing.assert_close(got, torch.tensor(values, dtype=torch.float32)), name
