"""``requests.resolve``: every field checked against the model card, defaults filled in,
and the stored parameters round-trip to the same render request."""

from __future__ import annotations

import math

import pytest

from jacana_multimodal.errors import InvalidVideoRequest
from jacana_multimodal.pipelines.cards import WAN21_I2V_TINY, WAN21_T2V_TINY
from jacana_multimodal.requests import VideoParams, resolve

CARD = WAN21_T2V_TINY


def test_defaults_come_from_the_card() -> None:
    params = resolve(CARD, prompt="a heron")
    assert params.size == CARD.default_size
    assert str(params.seconds) == CARD.default_seconds
    assert params.fps == CARD.default_fps
    assert params.num_inference_steps == CARD.default_steps
    assert params.guidance_scale == CARD.default_guidance_scale
    assert 0 <= params.seed < 2**31
    request = params.render_request()
    assert request.num_frames == params.seconds * params.fps
    assert (request.width, request.height) == (params.width, params.height)


def test_parameters_round_trip_through_their_json_form() -> None:
    params = resolve(CARD, prompt="a heron", seconds="3", size="160x96", seed=11, fps=12)
    assert VideoParams.from_json(params.to_json()) == params
    assert (params.width, params.height) == (160, 96)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": "x" * (CARD.max_prompt_chars + 1)}, "prompt"),
        ({"seconds": "9"}, "seconds"),
        ({"seconds": "2.5"}, "seconds"),
        ({"size": "1280x720"}, "size"),
        ({"size": "128"}, "size"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"num_inference_steps": CARD.max_steps + 1}, "num_inference_steps"),
        ({"guidance_scale": -0.5}, "guidance_scale"),
        ({"guidance_scale": math.nan}, "guidance_scale"),
        ({"guidance_scale": math.inf}, "guidance_scale"),
        ({"fps": 0}, "fps"),
        ({"fps": CARD.max_fps + 1}, "fps"),
        ({"negative_prompt": "x" * 5000}, "negative_prompt"),
        ({"has_input": True}, "input_reference"),
    ],
)
def test_each_bad_field_is_named(fields: dict, param: str) -> None:
    with pytest.raises(InvalidVideoRequest) as exc:
        resolve(CARD, **{"prompt": "a heron", **fields})
    assert exc.value.param == param


def test_an_image_to_video_card_takes_a_reference() -> None:
    assert resolve(WAN21_I2V_TINY, prompt="a heron", has_input=True).has_input


def test_a_remix_keeps_everything_but_the_prompt() -> None:
    source = resolve(CARD, prompt="a heron", seed=3, size="64x64")
    remix = source.remixed("video_abc", "a crane", CARD)
    assert remix.prompt == "a crane" and remix.remixed_from == "video_abc"
    assert remix.to_json() | {"prompt": "a heron", "remixed_from": ""} == source.to_json()
    with pytest.raises(InvalidVideoRequest):
        source.remixed("video_abc", "", CARD)
