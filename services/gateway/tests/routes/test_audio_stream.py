"""POST /v1/audio/transcriptions with stream=true: the service's TranscribeStream events
as OpenAI's server-sent events, read raw and by the official SDK; errors before the first
event as HTTP errors, after it as an error event; a client that leaves cancels the call.

The recording ASR service (``routes/conftest.py``) streams the scripted :data:`EVENTS`:
two windows (the second closes two segments), an empty window, then the whole response.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import httpx
import openai
import pytest

from jacana_common.errors import grpc_details
from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb

ASR = "whisper-test"
TRANSCRIBE = "/v1/audio/transcriptions"
AUDIO = ("clip.wav", b"RIFF not really a wav", "audio/wav")

SEGMENTS = [
    pb.Segment(id=0, start=0.0, end=1.5, text=" Hello there.", tokens=[1, 2, 3]),
    pb.Segment(id=1, start=1.5, end=3.0, text=" General", tokens=[4]),
    pb.Segment(id=2, start=3.0, end=3.25, text=" Kenobi. ", tokens=[5, 6]),
]
TEXT = "Hello there. General Kenobi."
EVENTS = [
    pb.TranscribeStreamEvent(segments=pb.SegmentBatch(segments=SEGMENTS[:1]), seconds_done=1.5),
    pb.TranscribeStreamEvent(segments=pb.SegmentBatch(segments=SEGMENTS[1:]), seconds_done=3.25),
    pb.TranscribeStreamEvent(segments=pb.SegmentBatch(), seconds_done=3.25),
    pb.TranscribeStreamEvent(
        done=pb.TranscribeResponse(text=TEXT, language="en", duration=3.25, segments=SEGMENTS),
        seconds_done=3.25,
    ),
]
DELTAS = ["Hello there.", " General", " Kenobi."]
USAGE = {
    "type": "tokens",
    "input_tokens": 163,  # 3.25 s at 50 audio tokens a second, rounded up
    "output_tokens": 6,
    "total_tokens": 169,
    "input_token_details": {"audio_tokens": 163},
}


@pytest.fixture
async def asr(make_asr):
    running = await make_asr()
    running.servicer.events = list(EVENTS)
    return running


@pytest.fixture
def settings(make_settings, dead_address, asr):
    return make_settings({"llm": [dead_address()]}, asr={ASR: [asr.address]})


@pytest.fixture
async def served(make_client, settings) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client(settings) as client:
        yield client


async def post(client: httpx.AsyncClient, **fields) -> httpx.Response:
    form = {"model": ASR, "stream": "true", **fields}
    return await client.post(TRANSCRIBE, data=form, files={"file": AUDIO})


def sse_data(body: str) -> list[str]:
    """The ``data:`` payloads of an event stream, in order; every event is one line."""
    assert body.endswith("\n\n"), body
    chunks = body.split("\n\n")[:-1]
    assert all(chunk.startswith("data: ") and "\n" not in chunk for chunk in chunks), body
    return [chunk.removeprefix("data: ") for chunk in chunks]


async def test_segments_stream_as_deltas_then_one_done_event(served, asr):
    resp = await post(served)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["cache-control"] == "no-cache"
    events = [json.loads(data) for data in sse_data(resp.text)]  # no [DONE]: OpenAI's shape
    assert events == [
        *({"type": "transcript.text.delta", "delta": d} for d in DELTAS),
        {"type": "transcript.text.done", "text": TEXT, "usage": USAGE},
    ]
    assert "".join(DELTAS) == TEXT
    (sent,) = asr.servicer.requests
    assert sent.audio == AUDIO[1] and sent.task == pb.TASK_TRANSCRIBE


async def test_the_sdk_consumes_the_stream(settings, asr):
    from jacana_gateway.app import create_app

    transport = httpx.ASGITransport(app=(app := create_app(settings)))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport) as http,
        openai.AsyncOpenAI(base_url="http://gw/v1", api_key="x", http_client=http) as client,
    ):
        stream = await client.audio.transcriptions.create(model=ASR, file=AUDIO[:2], stream=True)
        events = [event async for event in stream]
    assert [type(e).__name__ for e in events] == [
        "TranscriptionTextDeltaEvent",
        "TranscriptionTextDeltaEvent",
        "TranscriptionTextDeltaEvent",
        "TranscriptionTextDoneEvent",
    ]
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == TEXT
    usage = events[-1].usage
    assert (usage.type, usage.input_tokens, usage.output_tokens) == ("tokens", 163, 6)
    assert usage.input_token_details.audio_tokens == 163


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"response_format": "verbose_json"}, "stream"),
        ({"response_format": "text"}, "stream"),
        ({"stream": "maybe"}, "stream"),
        ({"include[]": "logprobs", "response_format": "srt", "stream": "false"}, "include"),
    ],
)
async def test_bad_stream_forms_are_400s(served, asr, fields, param):
    resp = await post(served, **fields)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
    assert not asr.servicer.requests


async def test_translations_do_not_stream(served):
    resp = await served.post(
        "/v1/audio/translations", data={"model": ASR, "stream": "true"}, files={"file": AUDIO}
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "stream"


async def test_stream_false_answers_json(served, asr):
    asr.servicer.reply = EVENTS[-1].done
    resp = await post(served, stream="false")
    assert resp.status_code == 200 and resp.json()["text"] == TEXT
    assert len(asr.servicer.requests) == 1


@pytest.mark.parametrize(
    "code, status, param",
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400, "file"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429, None),
        (grpc.StatusCode.INTERNAL, 503, None),
    ],
)
async def test_errors_before_the_first_event_are_http_errors(served, asr, code, status, param):
    asr.servicer.error = (code, "the service says no", param)
    resp = await post(served)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["param"] == param


async def test_audio_too_long_points_to_jobs(served, asr):
    asr.servicer.error = (grpc.StatusCode.INVALID_ARGUMENT, "too long", "file")
    asr.servicer.error_code = "audio_too_long"
    error = (await post(served)).json()["error"]
    assert error["code"] == "audio_too_long" and "/v1/audio/transcriptions/jobs" in error["message"]


async def test_a_stream_without_events_is_a_503(served, asr):
    asr.servicer.events = []
    resp = await post(served)
    assert resp.status_code == 503, resp.text


async def test_a_failure_after_the_first_event_is_an_error_event(served, asr):
    asr.servicer.events = EVENTS[:1]
    details = grpc_details("the model failed", None)
    asr.servicer.error_after_events = (grpc.StatusCode.INTERNAL, details)
    resp = await post(served)
    assert resp.status_code == 200
    first, last = (json.loads(d) for d in sse_data(resp.text))
    assert first == {"type": "transcript.text.delta", "delta": "Hello there."}
    assert set(last) == {"error"} and last["error"]["message"] == "the model failed"


async def test_the_sdk_raises_the_error_event(settings, asr):
    asr.servicer.events = EVENTS[:1]
    asr.servicer.error_after_events = (grpc.StatusCode.INTERNAL, "the model failed")
    from jacana_gateway.app import create_app

    transport = httpx.ASGITransport(app=(app := create_app(settings)))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport) as http,
        openai.AsyncOpenAI(base_url="http://gw/v1", api_key="x", http_client=http) as client,
    ):
        stream = await client.audio.transcriptions.create(model=ASR, file=AUDIO[:2], stream=True)
        with pytest.raises(openai.APIError, match="the model failed"):
            async for _ in stream:
                pass


async def test_a_client_that_leaves_cancels_the_service_call(serve, settings, asr):
    asr.servicer.events = EVENTS[:1]
    asr.servicer.hang_after_events = True
    async with serve(settings) as url, httpx.AsyncClient() as http:
        form = {"model": ASR, "stream": "true"}
        async with http.stream("POST", url + TRANSCRIBE, data=form, files={"file": AUDIO}) as r:
            assert r.status_code == 200
            first = await anext(r.aiter_lines())
            assert json.loads(first.removeprefix("data: "))["delta"] == "Hello there."
        await asyncio.wait_for(asr.servicer.cancelled.wait(), 5)


def with_logprobs(segment: pb.Segment) -> pb.Segment:
    """``segment`` with one token log-probability per word of its text."""
    out = pb.Segment()
    out.CopyFrom(segment)
    for n, word in enumerate(segment.text.rstrip().split(" ")[1:]):
        token = " " + word
        out.logprobs.add(token=token, bytes=token.encode(), logprob=-0.5 * n)
    return out


async def test_include_logprobs_adds_each_deltas_tokens(served, asr):
    segments = [with_logprobs(s) for s in SEGMENTS]
    asr.servicer.events = [
        pb.TranscribeStreamEvent(segments=pb.SegmentBatch(segments=segments)),
        pb.TranscribeStreamEvent(done=pb.TranscribeResponse(text=TEXT, segments=segments)),
    ]
    resp = await post(served, **{"include[]": "logprobs"})
    *deltas, done = (json.loads(d) for d in sse_data(resp.text))
    hello = [
        {"token": " Hello", "logprob": 0.0, "bytes": list(b" Hello")},
        {"token": " there.", "logprob": -0.5, "bytes": list(b" there.")},
    ]
    first = {"type": "transcript.text.delta", "delta": "Hello there.", "logprobs": hello}
    assert deltas[0] == first
    assert [t["token"] for d in deltas for t in d["logprobs"]] == [
        " Hello",
        " there.",
        " General",
        " Kenobi.",
    ]
    assert done["logprobs"] == [t for d in deltas for t in d["logprobs"]]
    assert asr.servicer.requests[0].logprobs


async def test_include_logprobs_without_streaming_is_in_the_json(served, asr):
    asr.servicer.reply = pb.TranscribeResponse(
        text=TEXT, duration=3.25, segments=[with_logprobs(s) for s in SEGMENTS]
    )
    body = (await post(served, stream="false", **{"include[]": "logprobs"})).json()
    assert [t["token"] for t in body["logprobs"]] == [" Hello", " there.", " General", " Kenobi."]
    assert body["logprobs"][1] == {"token": " there.", "logprob": -0.5, "bytes": list(b" there.")}
    assert set(body) == {"text", "logprobs", "usage"}
    await post(served, stream="false")
    assert [r.logprobs for r in asr.servicer.requests] == [True, False]
