"""No accepted transcription job is lost, and a deleted one stops: a worker SIGKILLed
mid-job, the gateway and the ASR service restarted, a job deleted while queued and while
running. Real processes throughout: redis-server with append-only persistence, Celery
workers, Whisper tiny.en."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stack_asr import ASR_MODEL_ID, SENTENCES, AsrJobStack, speech_wav, start_asr_job_stack

JOBS = "/audio/transcriptions/jobs"
TASK = "jacana.transcription.transcribe"


@pytest.fixture
def stack(tmp_path) -> Iterator[AsrJobStack]:
    running = start_asr_job_stack(
        tmp_path,
        workers=0,
        # Short enough that a dead worker's job moves on within seconds; longer than any
        # job here.
        JACANA_ASR_LONGEST_JOB_S="12",
        JACANA_ASR_VISIBILITY_TIMEOUT_S="15",
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def long_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 80 s of speech: seconds of work for the worker."""
    return speech_wav(tmp_path_factory.mktemp("speech"), "long", SENTENCES * 2)


@pytest.fixture(scope="module")
def short_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speech_wav(tmp_path_factory.mktemp("speech"), "short", SENTENCES[:1])


def create_job(http: httpx.Client, audio: Path) -> str:
    resp = http.post(
        JOBS, data={"model": ASR_MODEL_ID}, files={"file": ("a.wav", audio.read_bytes())}
    )
    assert resp.status_code == 200, resp.text
    return resp.json()["id"]


def wait_for(http: httpx.Client, job_id: str, predicate, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = http.get(f"{JOBS}/{job_id}").json()
        if predicate(job):
            return job
        assert time.monotonic() < deadline, f"{job_id} stuck: {job}"
        time.sleep(0.05)


def wait_for_log(worker, text: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in worker.log_text():
        assert time.monotonic() < deadline, worker.log_text()
        time.sleep(0.1)


def test_a_job_whose_worker_is_killed_completes_on_another(stack, long_wav):
    with stack.http() as http:
        first = stack.start_worker("first")
        job_id = create_job(http, long_wav)
        wait_for(http, job_id, lambda j: j["status"] == "in_progress")
        first.kill()
        assert f"{TASK} {job_id}: completed" not in first.log_text()
        second = stack.start_worker("second")
        done = wait_for(http, job_id, lambda j: j["status"] in ("completed", "failed"))
        assert done["status"] == "completed", done["error"]
        assert done["progress"] == pytest.approx(done["duration"])
        assert f"{TASK} {job_id}: completed" in second.log_text()
        text = http.get(f"{JOBS}/{job_id}/result", params={"response_format": "text"}).text
        assert "quick" in text.lower() and "bridge" in text.lower()


def test_every_job_survives_a_gateway_and_service_restart(stack, short_wav):
    with stack.http() as http:
        worker = stack.start_worker()
        done = create_job(http, short_wav)
        wait_for(http, done, lambda j: j["status"] == "completed")
        before = http.get(f"{JOBS}/{done}/result", params={"response_format": "verbose_json"})
        worker.stop()
        queued = create_job(http, short_wav)
    stack.gateway.stop()
    stack.service.stop()
    stack.start_service()
    stack.start_gateway()
    with stack.http() as http:
        assert http.get(f"{JOBS}/{done}").json()["status"] == "completed"
        after = http.get(f"{JOBS}/{done}/result", params={"response_format": "verbose_json"})
        assert after.text == before.text
        assert http.get(f"{JOBS}/{queued}").json()["status"] == "queued"
        resp = http.get(f"{JOBS}/{queued}/result")
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "job_not_ready"
        stack.start_worker()
        wait_for(http, queued, lambda j: j["status"] == "completed")
        assert http.get(f"{JOBS}/{queued}/result").json()["text"] == before.json()["text"]


def test_a_deleted_queued_job_never_runs(stack, short_wav):
    with stack.http() as http:
        job_id = create_job(http, short_wav)
        assert http.delete(f"{JOBS}/{job_id}").json()["deleted"] is True
        assert not (stack.storage_dir / "transcriptions" / job_id / "upload").exists()
        worker = stack.start_worker()
        wait_for_log(worker, f"{TASK} {job_id}: skipped")
        assert http.get(f"{JOBS}/{job_id}").status_code == 404


def test_a_job_deleted_while_running_stops_without_a_result(stack, long_wav):
    with stack.http() as http:
        worker = stack.start_worker()
        job_id = create_job(http, long_wav)
        # Progress moves window by window, in seconds of audio.
        job = wait_for(http, job_id, lambda j: j["status"] == "in_progress" and j["progress"] > 0)
        assert 0 < job["progress"] < job["duration"]
        assert http.delete(f"{JOBS}/{job_id}").status_code == 200
        assert http.get(f"{JOBS}/{job_id}").status_code == 404
        # It stops at the next window, not at the end of the file.
        wait_for_log(worker, f"{TASK} {job_id}: cancelled", timeout_s=30.0)
        assert not (stack.storage_dir / "transcriptions" / job_id / "result.json").exists()
