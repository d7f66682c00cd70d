"""The model registry: specs from settings, cards without weights, loading by architecture."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jacana_multimodal.pipelines import cards
from jacana_multimodal.pipelines.registry import (
    ARCHITECTURES,
    DEFAULT_MODEL_ID,
    ModelSpec,
    card_for,
    default_specs,
    load_model,
    parse_model_specs,
)


def test_default_is_the_tiny_random_model():
    (spec,) = default_specs()
    assert spec == ModelSpec(id=DEFAULT_MODEL_ID, architecture="wan2.1-t2v-tiny", path=None)
    card = card_for(spec)
    assert card.id == "wan-tiny-random" and card.architecture == "wan2.1-t2v-tiny"
    assert card.random_weights and "noise" in card.description
    assert (card.default_size, card.default_seconds, card.default_fps) == ("128x128", "2", 8)
    assert (card.default_steps, card.default_guidance_scale) == (4, 5.0)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_card_is_consistent(name):
    card = ARCHITECTURES[name].card
    assert card.architecture == name
    assert card.default_size in card.sizes and card.default_seconds in card.seconds
    for size in card.sizes:
        width, height = (int(n) for n in size.split("x"))
        # Wan: the VAE downsamples by 8 and the transformer patches 2x2.
        assert width % 16 == 0 and height % 16 == 0, size
    assert 1 <= card.default_fps <= card.max_fps
    assert 1 <= card.default_steps <= card.max_steps
    assert card.image_to_video == ("i2v" in name)


def test_card_for_takes_the_spec_id():
    card = card_for(ModelSpec("wan-1.3b", "wan2.1-t2v", Path("/models/wan")))
    assert card == dataclasses.replace(cards.WAN21_T2V, id="wan-1.3b")
    assert card.default_fps == 16 and card.default_steps == 50 and "1280x720" in card.sizes


def test_parse_json_text_and_lists():
    text = json.dumps(
        [
            {"id": "wan-t2v", "architecture": "wan2.1-t2v", "path": "/models/t2v"},
            {"id": "tiny", "architecture": "wan2.1-t2v-tiny"},
            {"id": "tiny-i2v", "architecture": "wan2.1-i2v-tiny", "path": None},
        ]
    )
    specs = parse_model_specs(text)
    assert specs == (
        ModelSpec("wan-t2v", "wan2.1-t2v", Path("/models/t2v")),
        ModelSpec("tiny", "wan2.1-t2v-tiny"),
        ModelSpec("tiny-i2v", "wan2.1-i2v-tiny"),
    )
    assert parse_model_specs(json.loads(text)) == specs
    assert parse_model_specs(list(specs)) == specs


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('[{"id": "a", "architecture": "sora-2", "path": "/m"}]', "unknown video architecture"),
        ('[{"id": "a", "architecture": "wan2.1-i2v"}]', "needs 'path'"),
        ('[{"id": "a", "architecture": "wan2.1-t2v", "path": ""}]', "needs 'path'"),
        ('[{"architecture": "wan2.1-t2v-tiny"}]', "'id' must be a non-empty string"),
        ('[{"id": "a", "architecture": "wan2.1-t2v-tiny", "weights": "/m"}]', "unknown keys"),
        (
            '[{"id": "a", "architecture": "wan2.1-t2v-tiny"}, {"id": "a", "architecture": '
            '"wan2.1-i2v-tiny"}]',
            "duplicate ids",
        ),
        ("[]", "empty"),
        ("{", "not valid JSON"),
        ('{"id": "a"}', "expected a list"),
        ('["wan2.1-t2v"]', "expected an object"),
    ],
)
def test_parse_rejects_bad_values_clearly(value, message):
    with pytest.raises(ValueError, match=message):
        parse_model_specs(value)


def test_unknown_architecture_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        card_for(ModelSpec("a", "wan9"))
    assert "wan2.1-t2v" in str(err.value) and "wan2.1-i2v-tiny" in str(err.value)


def test_cards_import_neither_torch_nor_diffusers():
    """The service validates against cards and must not pay for torch's import."""
    code = (
        "import sys; from jacana_multimodal.pipelines import registry; "
        "registry.card_for(registry.default_specs()[0]); "
        'registry.parse_model_specs(\'[{"id": "a", "architecture": "wan2.1-t2v-tiny"}]\'); '
        "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_load_model_builds_the_embedded_model_in_the_cache(wan_cache, tiny_t2v_dir):
    model = load_model(ModelSpec("tiny", "wan2.1-t2v-tiny"), wan_cache, "cpu", torch.float32)
    assert model.card == card_for(ModelSpec("tiny", "wan2.1-t2v-tiny"))
    assert model.pipeline.transformer.device.type == "cpu"


def test_load_model_names_a_path_that_is_not_a_model(tmp_path):
    spec = ModelSpec("wan", "wan2.1-t2v", tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"no model_index\.json"):
        load_model(spec, tmp_path, "cpu", torch.float32)
