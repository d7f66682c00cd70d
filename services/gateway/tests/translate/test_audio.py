"""The response formats of /v1/audio/*, as pure functions of a TranscribeResponse.

OpenAI's own SDK types are the oracle for the JSON shapes: every field they define is
present (and no segment field they lack), and they parse what we send.
"""

from __future__ import annotations

import json

import pytest
from openai.types.audio import TranscriptionSegment, TranscriptionVerbose, TranslationVerbose

from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_gateway.translate.audio import RENDERERS, timestamp

RESPONSE = pb.TranscribeResponse(
    text="First words. Then --> an arrow, über.",
    language="de",
    language_name="german",
    duration=3725.75,
    segments=[
        pb.Segment(
            id=0,
            seek=0,
            start=0.0,
            end=2.5,
            text=" First words.",
            tokens=[50364, 11, 12, 50489],
            avg_logprob=-0.25,
            compression_ratio=1.25,
            no_speech_prob=0.0625,
            temperature=0.0,
        ),
        pb.Segment(
            id=1,
            seek=372000,
            start=3723.2514,
            end=3725.75,
            text=" Then --> an arrow, über. ",
            tokens=[13],
            avg_logprob=-1.5,
            compression_ratio=2.5,
            no_speech_prob=0.5,
            temperature=0.2,
        ),
    ],
)


def render(fmt: str, task: str = "transcribe", response: pb.TranscribeResponse = RESPONSE):
    return RENDERERS[fmt](response, task)


@pytest.mark.parametrize(
    "seconds, srt, vtt",
    [
        (0.0, "00:00:00,000", "00:00:00.000"),
        (1.0004, "00:00:01,000", "00:00:01.000"),
        (1.0006, "00:00:01,001", "00:00:01.001"),  # to the nearest millisecond
        (59.9996, "00:01:00,000", "00:01:00.000"),
        (3723.2514, "01:02:03,251", "01:02:03.251"),
        (36000.0, "10:00:00,000", "10:00:00.000"),
        (-0.01, "00:00:00,000", "00:00:00.000"),
    ],
)
def test_timestamps(seconds, srt, vtt):
    assert timestamp(seconds, ",") == srt
    assert timestamp(seconds, ".") == vtt


def test_srt():
    rendered = render("srt")
    assert rendered.content == (
        "1\n00:00:00,000 --> 00:00:02,500\nFirst words.\n"
        "\n"
        "2\n01:02:03,251 --> 01:02:05,750\nThen -> an arrow, über.\n"
    )
    assert rendered.media_type.startswith("text/plain")


def test_vtt():
    rendered = render("vtt")
    assert rendered.content == (
        "WEBVTT\n\n"
        "00:00:00.000 --> 00:00:02.500\nFirst words.\n\n"
        "01:02:03.251 --> 01:02:05.750\nThen -> an arrow, über.\n\n"
    )
    assert rendered.media_type.startswith("text/vtt")


def test_no_segments():
    empty = pb.TranscribeResponse(text="", language="en", duration=0.5)
    assert render("srt", response=empty).content == ""
    assert render("vtt", response=empty).content == "WEBVTT\n\n"
    assert render("text", response=empty).content == "\n"
    assert json.loads(render("verbose_json", response=empty).content)["segments"] == []


def test_text_and_json():
    assert render("text").content == RESPONSE.text + "\n"
    body = json.loads(render("json").content)
    assert body == {"text": RESPONSE.text, "usage": {"type": "duration", "seconds": 3726}}
    assert json.loads(render("json", "translate").content) == {"text": RESPONSE.text}
    assert "über" in render("json").content  # UTF-8, not \\u escapes


def test_verbose_json_has_openais_shape():
    body = json.loads(render("verbose_json").content)
    parsed = TranscriptionVerbose.model_validate(body)
    assert set(body) == {"task", "language", "duration", "text", "segments", "usage"}
    assert (body["task"], body["language"], body["duration"]) == ("transcribe", "german", 3725.75)
    assert parsed.usage is not None and parsed.usage.seconds == 3726
    segment = body["segments"][1]
    assert set(segment) == set(TranscriptionSegment.model_fields)
    assert segment == {
        "id": 1,
        "seek": 372000,
        "start": 3723.2514,
        "end": 3725.75,
        "text": " Then --> an arrow, über. ",  # as the model wrote it
        "tokens": [13],
        "temperature": 0.2,  # doubles on the wire: no float32 noise
        "avg_logprob": -1.5,
        "compression_ratio": 2.5,
        "no_speech_prob": 0.5,
    }


def test_verbose_translation_is_in_english_without_usage():
    body = json.loads(render("verbose_json", "translate").content)
    TranslationVerbose.model_validate(body)
    assert (body["task"], body["language"]) == ("translate", "english")
    assert "usage" not in body


def test_an_unnamed_language_falls_back_to_its_code():
    unnamed = pb.TranscribeResponse(text="x", language="xx", duration=1.0)
    assert json.loads(render("verbose_json", response=unnamed).content)["language"] == "xx"
