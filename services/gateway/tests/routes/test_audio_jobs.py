"""/v1/audio/transcriptions/jobs at the gateway: the form is checked as the synchronous
route checks it, the job object's shape, routing (a new job to its model's replicas, the
calls by id to any, a replica without jobs skipped), the result in every format, and the
service's failures as HTTP errors. The ASR service is the recording double of
``routes/conftest.py``; the real service is tests/test_e2e_asr_jobs.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_gateway.translate.audio import RENDERERS

ASR = "whisper-test"
LLM = "llm"
JOBS = "/v1/audio/transcriptions/jobs"
AUDIO = ("clip.wav", b"RIFF not really a wav", "audio/wav")
JOB = pb.TranscriptionJob(
    id="transcription_abc",
    model="served-name",
    status="in_progress",
    progress_seconds=30.0,
    duration=61.5,
    created_at=1700000000,
    expires_at=1700086400,
    response_format="srt",
)
REPLY = pb.TranscribeResponse(
    text="Hello there.",
    language="en",
    language_name="english",
    duration=1.5,
    segments=[pb.Segment(id=0, start=0.0, end=1.5, text=" Hello there.", tokens=[1, 2])],
)


@pytest.fixture
async def asr(make_asr):
    running = await make_asr()
    running.servicer.job = JOB
    running.servicer.reply = REPLY
    return running


@pytest.fixture
def gateway(make_settings, make_client, dead_address):
    def open_client(endpoints: list[str] | None = None, **overrides):
        asr = {ASR: endpoints or [dead_address()]}
        return make_client(make_settings({LLM: [dead_address()]}, asr=asr, **overrides))

    return open_client


@pytest.fixture
async def served(gateway, asr) -> AsyncIterator:
    async with gateway([asr.address]) as client:
        yield client


async def create(client, **fields):
    return await client.post(JOBS, data={"model": ASR, **fields}, files={"file": AUDIO})


async def test_create_sends_the_upload_and_its_options(served, asr):
    resp = await create(served, language="en", prompt="Hi.", response_format="srt")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "id": "transcription_abc",
        "object": "audio.transcription.job",
        "model": "served-name",
        "status": "in_progress",
        "progress": 30.0,
        "duration": 61.5,
        "created_at": 1700000000,
        "completed_at": None,
        "expires_at": 1700086400,
        "response_format": "srt",
        "language": None,
        "error": None,
    }
    sent = asr.servicer.requests[0]
    assert sent.request.audio == AUDIO[1] and sent.request.filename == "clip.wav"
    assert (sent.request.language, sent.request.prompt) == ("en", "Hi.")
    assert sent.request.task == pb.TASK_TRANSCRIBE and sent.response_format == "srt"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"temperature": "3"}, "temperature"),
        ({"response_format": "xml"}, "response_format"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities[]"),
        ({"colour": "blue"}, "colour"),
    ],
)
async def test_a_bad_form_is_a_400_before_any_call(gateway, fields, param):
    async with gateway() as client:  # a dead service: a request that got through is a 503
        resp = await create(client, **fields)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == param
        resp = await client.post(JOBS, data={"model": ASR})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "file"


async def test_models_are_checked_like_the_synchronous_route(gateway):
    async with gateway() as client:
        resp = await create(client, model="nope")
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
        resp = await create(client, model=LLM)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "model_not_supported"


async def test_calls_by_id_reach_the_service(served, asr):
    job = (await served.get(f"{JOBS}/transcription_abc")).json()
    assert job["status"] == "in_progress" and job["progress"] == 30.0
    deleted = (await served.delete(f"{JOBS}/transcription_abc")).json()
    assert deleted == {
        "id": "transcription_abc",
        "object": "audio.transcription.job.deleted",
        "deleted": True,
    }
    assert [r.job_id for r in asr.servicer.requests] == ["transcription_abc"] * 2


@pytest.mark.parametrize("response_format", list(RENDERERS))
async def test_the_result_in_every_format(served, response_format):
    resp = await served.get(
        f"{JOBS}/transcription_abc/result", params={"response_format": response_format}
    )
    expected = RENDERERS[response_format](REPLY, "transcribe")
    assert resp.status_code == 200 and resp.text == expected.content
    assert resp.headers["content-type"].startswith(expected.media_type.split(";")[0])


async def test_a_job_with_word_timestamps_shows_its_words(served, asr):
    fields = {"timestamp_granularities[]": "word", "response_format": "verbose_json"}
    assert (await create(served, **fields)).status_code == 200
    assert asr.servicer.requests[0].request.word_timestamps
    asr.servicer.reply = pb.TranscribeResponse()
    asr.servicer.reply.CopyFrom(REPLY)
    asr.servicer.reply.segments[0].words.add(word=" Hello", start=0.0, end=0.5)
    url = f"{JOBS}/transcription_abc/result"
    body = (await served.get(url, params={"response_format": "verbose_json"})).json()
    assert body["words"] == [{"word": "Hello", "start": 0.0, "end": 0.5}] and body["segments"]


async def test_the_result_defaults_to_the_format_given_at_creation(served):
    resp = await served.get(f"{JOBS}/transcription_abc/result")
    assert resp.text == RENDERERS["srt"](REPLY, "transcribe").content
    bad = await served.get(f"{JOBS}/transcription_abc/result", params={"response_format": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format"


async def test_a_replica_without_jobs_is_skipped(make_asr, gateway, asr):
    disabled = await make_asr()
    disabled.servicer.error = (grpc.StatusCode.UNAVAILABLE, "no Redis here", None)
    disabled.servicer.error_code = "jobs_disabled"
    async with gateway([disabled.address, asr.address]) as client:
        for _ in range(2):  # whichever replica comes first
            assert (await create(client)).status_code == 200
            assert (await client.get(f"{JOBS}/transcription_abc")).status_code == 200
    async with gateway([disabled.address]) as client:
        resp = await create(client)
        assert resp.status_code == 503
        assert resp.json()["error"] == {
            "message": "no Redis here",
            "type": resp.json()["error"]["type"],
            "param": None,
            "code": "jobs_disabled",
        }


async def test_service_failures_become_http_errors(served, asr):
    asr.servicer.error = (grpc.StatusCode.RESOURCE_EXHAUSTED, "64 jobs wait", None)
    asr.servicer.error_code = "queue_full"
    asr.servicer.trailing_metadata = (("retry-after", "7"),)
    resp = await create(served)
    assert resp.status_code == 429 and resp.headers["retry-after"] == "7"
    asr.servicer.trailing_metadata = ()
    asr.servicer.error = (grpc.StatusCode.FAILED_PRECONDITION, "not yet", "job_id")
    asr.servicer.error_code = "job_not_ready"
    resp = await served.get(f"{JOBS}/transcription_abc/result", params={"response_format": "json"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "job_not_ready"
    asr.servicer.error = (grpc.StatusCode.NOT_FOUND, "no such job", "job_id")
    asr.servicer.error_code = None
    assert (await served.get(f"{JOBS}/transcription_x")).status_code == 404
    asr.servicer.error = (grpc.StatusCode.UNAVAILABLE, "redis at 10.0.0.3 down", None)
    resp = await served.get(f"{JOBS}/transcription_x")
    assert resp.status_code == 503 and "10.0.0.3" not in resp.text


async def test_without_asr_models_every_id_is_unknown(make_settings, make_client, dead_address):
    async with make_client(make_settings({LLM: [dead_address()]})) as client:
        for resp in (
            await client.get(f"{JOBS}/transcription_abc"),
            await client.get(f"{JOBS}/transcription_abc/result"),
            await client.delete(f"{JOBS}/transcription_abc"),
        ):
            assert resp.status_code == 404, resp.text
