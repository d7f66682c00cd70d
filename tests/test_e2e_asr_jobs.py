"""Transcription jobs end to end: gateway -> ASR service -> Redis -> a real Celery worker
running Whisper tiny.en, driven over HTTP as a client would (the SDK has no jobs method).

One stack for the module; each test makes its own jobs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stack_asr import ASR_MODEL_ID, AsrJobStack, speech_wav, start_asr_job_stack

JOBS = "/audio/transcriptions/jobs"
FORMATS = ("json", "text", "srt", "verbose_json", "vtt")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsrJobStack]:
    running = start_asr_job_stack(tmp_path_factory.mktemp("asr-jobs"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def long_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 40 s of speech: two 30 s windows."""
    return speech_wav(tmp_path_factory.mktemp("speech"), "long")


@pytest.fixture
def http(stack: AsrJobStack) -> Iterator[httpx.Client]:
    with stack.http() as client:
        yield client


def create_job(http: httpx.Client, audio: Path | bytes, **fields: str) -> dict:
    data = audio.read_bytes() if isinstance(audio, Path) else audio
    resp = http.post(JOBS, data={"model": ASR_MODEL_ID, **fields}, files={"file": ("a.wav", data)})
    assert resp.status_code == 200, resp.text
    return resp.json()


def wait_for(http: httpx.Client, job_id: str, predicate, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = http.get(f"{JOBS}/{job_id}").json()
        if predicate(job):
            return job
        assert time.monotonic() < deadline, f"{job_id} stuck: {job}"
        time.sleep(0.05)


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


def test_a_job_equals_the_synchronous_transcription_in_every_format(http, long_wav):
    job = create_job(http, long_wav)
    assert job["id"].startswith("transcription_") and job["object"] == "audio.transcription.job"
    assert job["status"] == "queued" and job["progress"] == 0.0
    assert job["model"] == ASR_MODEL_ID and job["error"] is None and job["completed_at"] is None
    assert job["duration"] > 30.0 and job["expires_at"] > job["created_at"]
    done = wait_for(http, job["id"], lambda j: j["status"] == "completed")
    assert done["progress"] == pytest.approx(done["duration"]) and done["completed_at"]
    for response_format in FORMATS:
        result = http.get(f"{JOBS}/{job['id']}/result", params={"response_format": response_format})
        sync = http.post(
            "/audio/transcriptions",
            data={"model": ASR_MODEL_ID, "response_format": response_format},
            files={"file": ("a.wav", long_wav.read_bytes())},
        )
        assert result.status_code == sync.status_code == 200, (result.text, sync.text)
        assert result.headers["content-type"] == sync.headers["content-type"]
        assert result.text == sync.text, response_format
    verbose = http.get(f"{JOBS}/{job['id']}/result", params={"response_format": "verbose_json"})
    segments = verbose.json()["segments"]
    assert len({s["seek"] for s in segments}) >= 2  # more than one window was transcribed


def test_the_result_format_defaults_to_the_one_given_at_creation(http, long_wav):
    job = create_job(http, long_wav, response_format="srt", language="en")
    assert job["response_format"] == "srt" and job["language"] == "en"
    wait_for(http, job["id"], lambda j: j["status"] == "completed")
    srt = http.get(f"{JOBS}/{job['id']}/result")
    assert srt.status_code == 200 and srt.text.startswith("1\n00:00:00,000 --> ")
    as_json = http.get(f"{JOBS}/{job['id']}/result", params={"response_format": "json"})
    assert json.loads(as_json.text)["text"]


@pytest.mark.parametrize(
    "fields, files, param",
    [
        ({"model": ASR_MODEL_ID}, None, "file"),
        ({"model": ASR_MODEL_ID, "temperature": "2"}, "long", "temperature"),
        ({"model": ASR_MODEL_ID, "response_format": "xml"}, "long", "response_format"),
        ({"model": ASR_MODEL_ID, "language": "xx"}, "long", "language"),
        ({"model": ASR_MODEL_ID}, b"not audio at all" * 64, "file"),
        ({"model": ASR_MODEL_ID}, b"", "file"),
        ({"model": ASR_MODEL_ID, "timestamp_granularities[]": "word"}, "long", None),
        ({"file_format": "wav", "model": ASR_MODEL_ID}, "long", "file_format"),
    ],
)
def test_a_bad_form_is_a_400_naming_the_field(http, long_wav, fields, files, param):
    if files == "long":
        files = {"file": ("a.wav", long_wav.read_bytes())}
    elif isinstance(files, bytes):
        files = {"file": ("a.wav", files)}
    error = error_of(http.post(JOBS, data=fields, files=files or {}), 400)
    assert error["param"] == (param or "timestamp_granularities[]"), error


def test_an_unknown_model_is_a_404(http, long_wav):
    resp = http.post(JOBS, data={"model": "whisper-1"}, files={"file": ("a.wav", b"x")})
    assert error_of(resp, 404)["code"] == "model_not_found"


def test_unknown_ids_are_404s(http):
    for resp in (
        http.get(f"{JOBS}/transcription_0123"),
        http.get(f"{JOBS}/transcription_0123/result"),
        http.delete(f"{JOBS}/transcription_0123"),
    ):
        assert error_of(resp, 404)["param"] == "job_id"


def test_a_deleted_job_is_gone_with_its_files(stack, http, long_wav):
    job = create_job(http, long_wav)
    wait_for(http, job["id"], lambda j: j["status"] == "completed")
    job_dir = stack.storage_dir / "transcriptions" / job["id"]
    assert (job_dir / "result.json").is_file()
    assert not (job_dir / "upload").exists()  # dropped once the result was written
    resp = http.delete(f"{JOBS}/{job['id']}")
    assert resp.status_code == 200
    assert resp.json() == {
        "id": job["id"],
        "object": "audio.transcription.job.deleted",
        "deleted": True,
    }
    assert not (job_dir / "result.json").exists()
    assert http.get(f"{JOBS}/{job['id']}").status_code == 404
    assert http.get(f"{JOBS}/{job['id']}/result").status_code == 404
