"""POST /v1/audio/transcriptions and /translations: the multipart form as OpenAI defines
it, errors before any service call, routing by model, and what a service's reply becomes.

Validation tests run against a gateway whose only ASR address is dead: a request that got
past validation would come back 503, so each expected 400/404/413 proves it was caught
first. The recording ASR service (``routes/conftest.py``) is not a model: it answers with
:data:`REPLY` (or a scripted error) and records what it was asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_gateway.settings import GatewaySettings

ASR = "whisper-test"
LLM = "llm"
TRANSCRIBE = "/v1/audio/transcriptions"
TRANSLATE = "/v1/audio/translations"
AUDIO = ("clip.wav", b"RIFF not really a wav", "audio/wav")

REPLY = pb.TranscribeResponse(
    text="Hello there. General Kenobi.",
    language="en",
    language_name="english",
    duration=3.25,
    segments=[
        pb.Segment(id=0, seek=0, start=0.0, end=1.5, text=" Hello there.", tokens=[1, 2, 3]),
        pb.Segment(
            id=1,
            seek=150,
            start=1.5,
            end=3.25,
            text=" General Kenobi.",
            tokens=[4, 5],
            avg_logprob=-0.25,
            compression_ratio=1.5,
            no_speech_prob=0.125,
            temperature=0.5,
        ),
    ],
    model_id="served-name",
)


@pytest.fixture
def gateway(make_settings, make_client, dead_address):
    """``gateway(asr_endpoints, **settings)``: the real gateway app, in-process, serving
    ``ASR`` there and a generation model ``LLM`` at a dead address."""

    def open_client(endpoints: list[str] | None = None, **overrides):
        asr = {ASR: endpoints or [dead_address()]}
        return make_client(make_settings({LLM: [dead_address()]}, asr=asr, **overrides))

    return open_client


@pytest.fixture
async def client(gateway) -> AsyncIterator[httpx.AsyncClient]:
    """Only a dead ASR address behind it: anything past validation is a 503."""
    async with gateway() as c:
        yield c


@pytest.fixture
async def asr(make_asr):
    running = await make_asr()
    running.servicer.reply = REPLY
    return running


@pytest.fixture
async def served(gateway, asr) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway([asr.address]) as c:
        yield c


def assert_error(resp: httpx.Response, status: int, param: str | None, code: str | None) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["message"]
    assert (error["param"], error["code"]) == (param, code), error
    return error


async def post(client, url=TRANSCRIBE, data=None, files=None, **fields):
    form = {"model": ASR, **fields} if data is None else data
    return await client.post(url, data=form, files={"file": AUDIO} if files is None else files)


# --- validation: nothing reaches a service ----------------------------------------------


@pytest.mark.parametrize(
    "fields, param, code",
    [
        ({"response_format": "xml"}, "response_format", "invalid_value"),
        ({"response_format": "diarized_json"}, "response_format", "invalid_value"),
        ({"temperature": "1.5"}, "temperature", "invalid_value"),
        ({"temperature": "-0.1"}, "temperature", "invalid_value"),
        ({"temperature": "nan"}, "temperature", "invalid_value"),
        ({"temperature": "warm"}, "temperature", "invalid_value"),
        ({"stream": "true", "response_format": "srt"}, "stream", "invalid_value"),
        ({"chunking_strategy": "auto"}, "chunking_strategy", "unsupported_parameter"),
        ({"include[]": "logprobs", "response_format": "text"}, "include", "invalid_value"),
        ({"include[]": "tokens"}, "include", "invalid_value"),
        ({"colour": "blue"}, "colour", "unknown_parameter"),
        ({"prompt": "x" * 10_001}, "prompt", "invalid_value"),
        ({"beam_size": "0"}, "beam_size", "invalid_value"),
        ({"beam_size": "17"}, "beam_size", "invalid_value"),
        ({"beam_size": "wide"}, "beam_size", "invalid_value"),
        ({"seed": "-1"}, "seed", "invalid_value"),
        ({"seed": str(2**32)}, "seed", "invalid_value"),
        ({"vad_filter": "maybe"}, "vad_filter", "invalid_value"),
    ],
)
async def test_bad_fields_are_400s(client, fields, param, code):
    assert_error(await post(client, **fields), 400, param, code)


@pytest.mark.parametrize("url", [TRANSCRIBE, TRANSLATE])
async def test_missing_file_or_model_is_a_400_naming_it(client, url):
    resp = await client.post(url, data={"model": ASR, "prompt": "hi"})  # url-encoded
    assert_error(resp, 400, "file", "missing_required_parameter")
    resp = await client.post(url, data={"model": ASR}, files={"audio": AUDIO})
    assert_error(resp, 400, "audio", "unknown_parameter")
    for data in ({}, {"model": ""}, {"prompt": "hi"}):
        resp = await post(client, url, data=data)
        assert_error(resp, 400, "model", "missing_required_parameter")


async def test_file_must_be_a_file_part(client):
    resp = await client.post(TRANSCRIBE, data={"model": ASR, "file": "text"})
    assert_error(resp, 400, "file", "invalid_value")


async def test_a_json_body_is_refused(client):
    resp = await client.post(TRANSCRIBE, json={"model": ASR, "file": "x"})
    assert_error(resp, 400, None, "invalid_content_type")


GRANULARITIES = "timestamp_granularities[]"  # the field's name in OpenAI's reference


async def test_granularities_need_verbose_json(client):
    for value in ("segment", "word"):
        resp = await post(client, **{"timestamp_granularities[]": value})
        error = assert_error(resp, 400, GRANULARITIES, "invalid_value")
        assert "verbose_json" in error["message"]
    resp = await post(
        client, **{"timestamp_granularities[]": "char", "response_format": "verbose_json"}
    )
    assert_error(resp, 400, GRANULARITIES, "invalid_value")


async def test_translations_take_no_transcription_only_fields(client):
    resp = await post(client, TRANSLATE, **{"timestamp_granularities[]": "segment"})
    assert_error(resp, 400, "timestamp_granularities[]", "unknown_parameter")


async def test_a_scalar_field_given_twice_is_a_400(client):
    resp = await post(client, data={"model": [ASR, ASR]})
    assert_error(resp, 400, "model", "invalid_value")


async def test_unknown_model_is_404_and_other_kinds_are_400(client):
    assert_error(await post(client, model="nope"), 404, "model", "model_not_found")
    error = assert_error(await post(client, model=LLM), 400, "model", "model_not_supported")
    assert "/v1/chat/completions" in error["message"]


async def test_body_over_the_audio_limit_is_a_413(gateway):
    async with gateway(max_audio_body_bytes=4096) as client:
        big = ("big.wav", b"\0" * 5000, "audio/wav")
        resp = await post(client, files={"file": big})
        assert_error(resp, 413, None, "request_too_large")
        # under the limit: validation and routing go on (dead service: 503)
        assert (await post(client)).status_code == 503


async def test_audio_bodies_may_exceed_the_json_limit(gateway, asr):
    async with gateway([asr.address], max_body_bytes=2048) as client:
        upload = ("clip.wav", b"\1" * 8192, "audio/wav")
        assert (await post(client, files={"file": upload})).status_code == 200
        chat = {"model": LLM, "messages": [{"role": "user", "content": "x" * 4096}]}
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == 413
    assert asr.servicer.requests[0].audio == b"\1" * 8192


async def test_unreachable_service_is_503(client):
    assert_error(await post(client), 503, None, None)


# --- through a recording ASR service -----------------------------------------------------


async def test_fields_reach_the_service(served, asr):
    fields = {"language": "de", "prompt": "Kenobi", "temperature": "0.4", "seed": "7"}
    assert (await post(served, **fields, beam_size="1", vad_filter="False")).status_code == 200
    assert (await post(served, TRANSLATE, model=ASR, vad_filter="true")).status_code == 200
    sent, translated = asr.servicer.requests
    assert sent.audio == AUDIO[1] and sent.filename == "clip.wav"
    assert (sent.language, sent.prompt, sent.temperature) == ("de", "Kenobi", 0.4)
    assert sent.task == pb.TASK_TRANSCRIBE and translated.task == pb.TASK_TRANSLATE
    assert sent.model == ""  # the gateway's name is not the service's
    assert (translated.language, translated.prompt, translated.temperature) == ("", "", 0.0)
    assert (sent.beam_size, sent.seed) == (1, 7)
    assert not translated.HasField("beam_size") and not translated.HasField("seed")
    assert sent.HasField("vad_filter") and (sent.vad_filter, translated.vad_filter) == (False, True)


WORDS = [
    pb.Word(word=" Hello", start=0.0, end=0.5, probability=0.9),
    pb.Word(word=" there.", start=0.5, end=1.25, probability=0.75),
]


@pytest.mark.parametrize("key", ["timestamp_granularities[]", "timestamp_granularities"])
async def test_word_timestamps_reach_verbose_json(served, asr, key):
    asr.servicer.reply = pb.TranscribeResponse()
    asr.servicer.reply.CopyFrom(REPLY)
    asr.servicer.reply.segments[0].words.extend(WORDS)
    words = [
        {"word": "Hello", "start": 0.0, "end": 0.5},
        {"word": "there.", "start": 0.5, "end": 1.25},
    ]

    resp = await post(served, **{key: "word", "response_format": "verbose_json"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["words"] == words and "segments" not in body  # OpenAI's shape for "word"
    both = {key: ["segment", "word"], "response_format": "verbose_json"}
    body = (await post(served, **both)).json()
    assert body["words"] == words and [s["id"] for s in body["segments"]] == [0, 1]
    body = (await post(served, response_format="verbose_json")).json()
    assert "words" not in body and len(body["segments"]) == 2
    asked = [request.word_timestamps for request in asr.servicer.requests]
    assert asked == [True, True, False]


async def test_json_is_the_default_format(served):
    resp = await post(served)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    assert resp.json() == {"text": REPLY.text, "usage": {"type": "duration", "seconds": 4}}
    translated = await post(served, TRANSLATE)
    assert translated.json() == {"text": REPLY.text}


async def test_each_format_is_served_with_its_media_type(served):
    types = {"text": "text/plain", "srt": "text/plain", "vtt": "text/vtt"}
    for fmt, media_type in types.items():
        resp = await post(served, response_format=fmt)
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].split(";")[0] == media_type
    assert (await post(served, response_format="text")).text == REPLY.text + "\n"
    verbose = (await post(served, response_format="verbose_json")).json()
    assert (verbose["task"], verbose["language"]) == ("transcribe", "english")
    translated = (await post(served, TRANSLATE, response_format="verbose_json")).json()
    assert (translated["task"], translated["language"]) == ("translate", "english")


@pytest.mark.parametrize(
    "code, param, status",
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "file", 400),
        (grpc.StatusCode.INVALID_ARGUMENT, "language", 400),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, None, 429),
        (grpc.StatusCode.DEADLINE_EXCEEDED, None, 504),
        (grpc.StatusCode.INTERNAL, None, 503),
    ],
)
async def test_service_errors_keep_their_status_and_param(served, asr, code, param, status):
    asr.servicer.error = (code, "the service says no", param)
    resp = await post(served)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["message"]) == (param, "the service says no")


async def test_a_dead_replica_is_skipped(gateway, asr, dead_address):
    async with gateway([dead_address(), asr.address]) as client:
        for _ in range(3):
            assert (await post(client)).status_code == 200
    assert len(asr.servicer.requests) == 3


async def test_client_disconnect_cancels_the_service_call(make_settings, serve, asr, dead_address):
    asr.servicer.hang = True
    settings = make_settings({LLM: [dead_address()]}, asr={ASR: [asr.address]})
    async with serve(settings) as url, httpx.AsyncClient() as http:
        request = asyncio.create_task(
            http.post(f"{url}{TRANSCRIBE}", data={"model": ASR}, files={"file": AUDIO})
        )
        await asyncio.wait_for(asr.servicer.started.wait(), 5)
        request.cancel()
        await asyncio.wait_for(asr.servicer.cancelled.wait(), 5)


# --- speech-to-text models in the rest of the gateway --------------------------------------


async def test_models_health_and_other_routes_know_asr_models(served, asr):
    ids = [m["id"] for m in (await served.get("/v1/models")).json()["data"]]
    assert ids == [LLM, ASR]
    assert (await served.get(f"/v1/models/{ASR}")).json()["id"] == ASR
    health_body = (await served.get("/health")).json()
    assert health_body["models"][ASR]["kind"] == "asr"
    assert health_body["models"][ASR]["replicas"] == {asr.address: "serving"}
    chat = {"model": ASR, "messages": [{"role": "user", "content": "hi"}]}
    error = assert_error(
        await served.post("/v1/chat/completions", json=chat), 400, "model", "model_not_supported"
    )
    assert "/v1/audio/transcriptions" in error["message"]


async def test_a_gateway_can_serve_asr_alone(make_client, asr):
    async with make_client(GatewaySettings(asr={ASR: [asr.address]})) as client:
        assert (await client.get("/health")).status_code == 200
        assert (await post(client)).status_code == 200


def test_settings_validate_asr_endpoints(make_settings):
    assert make_settings(asr={ASR: ["127.0.0.1:1"]}).asr == {ASR: ["127.0.0.1:1"]}
    for bad in ({ASR: ["not an address"]}, {ASR: []}, {"bad id": ["127.0.0.1:1"]}):
        with pytest.raises(ValueError):
            GatewaySettings(engines={LLM: ["127.0.0.1:1"]}, asr=bad)
    with pytest.raises(ValueError, match="appear in both"):
        GatewaySettings(embeddings={ASR: ["127.0.0.1:1"]}, asr={ASR: ["127.0.0.1:2"]})
