"""``TranscriptionJobs`` on a real redis-server and a local storage directory, without
workers: what the service writes, refuses and cleans up. (Transcribing is
tests/test_e2e_asr_jobs.py and tests/test_asr_job_durability.py.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jacana_asr.errors import (
    InvalidRequestError,
    JobNotFoundError,
    JobNotReadyError,
    ModelNotFoundError,
    QueueFullError,
)
from jacana_asr.jobs import (
    JOB_KIND,
    CreateJob,
    JobParams,
    TranscriptionJobs,
    result_key,
    upload_key,
)
from jacana_asr.transcription import TranscribeOptions
from jacana_jobs import JobStatus, LocalStorage, make_celery
from redis_server import RedisServer

MODEL = "whisper-test"
QUEUE = "jacana.transcription.test"


def make_jobs(redis_server: RedisServer, root: Path, **limits) -> TranscriptionJobs:
    celery = make_celery("test", redis_server.url, visibility_timeout_s=20, longest_task_s=10)
    options = {
        "model_id": MODEL,
        "queue": QUEUE,
        "ttl_s": 3600.0,
        "max_queued": 8,
        "retry_after_s": 7,
        "max_audio_seconds": 10.0,
        "decode_timeout_s": 30.0,
        **limits,
    }
    return TranscriptionJobs(redis_server.client(), LocalStorage(root / "files"), celery, **options)


def create(jobs: TranscriptionJobs, audio: bytes, **fields) -> CreateJob:
    return jobs.create(CreateJob(audio=audio, options=TranscribeOptions(**fields)))


def files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "files").rglob("*") if p.is_file())


def test_create_stores_the_upload_and_queues_the_job(redis_server, tmp_path, speech_wav):
    jobs = make_jobs(redis_server, tmp_path)
    audio = speech_wav.read_bytes()
    view = create(jobs, audio, language="EN", prompt="Foxes.")
    record = view.record
    assert record.id.startswith("transcription_") and record.kind == JOB_KIND
    assert record.status == JobStatus.QUEUED and record.model == MODEL
    assert view.params.options == TranscribeOptions(language="en", prompt="Foxes.")
    assert view.params.duration == pytest.approx(len(audio[44:]) / 32000, abs=0.01)
    assert view.progress_seconds == 0.0
    assert redis_server.client().llen(QUEUE) == 1
    assert files(tmp_path) == [tmp_path / "files" / upload_key(record.id)]
    assert (tmp_path / "files" / upload_key(record.id)).read_bytes() == audio
    assert JobParams.from_json(record.params) == view.params


@pytest.mark.parametrize(
    "audio, fields, error, param",
    [
        (b"not audio" * 100, {}, InvalidRequestError, "file"),
        (b"", {}, InvalidRequestError, "file"),
        (None, {"language": "xx"}, InvalidRequestError, "language"),
        (None, {"temperature": 1.5}, InvalidRequestError, "temperature"),
        (None, {"task": "translate"}, InvalidRequestError, "task"),
    ],
)
def test_a_refused_create_leaves_nothing_behind(
    redis_server, tmp_path, speech_wav, audio, fields, error, param
):
    jobs = make_jobs(redis_server, tmp_path)
    with pytest.raises(error) as exc:
        create(jobs, speech_wav.read_bytes() if audio is None else audio, **fields)
    assert exc.value.param == param
    assert redis_server.client().keys("*") == [] and files(tmp_path) == []


def test_audio_past_the_job_limit_and_other_models_are_refused(redis_server, tmp_path, speech_wav):
    jobs = make_jobs(redis_server, tmp_path, max_audio_seconds=1.0)
    with pytest.raises(InvalidRequestError) as exc:
        create(jobs, speech_wav.read_bytes())
    assert (exc.value.param, exc.value.code) == ("file", "audio_too_long")
    with pytest.raises(ModelNotFoundError):
        jobs.create(CreateJob(audio=b"x", options=TranscribeOptions(), model="other"))
    assert redis_server.client().keys("*") == []


def test_a_full_queue_is_refused_with_retry_after(redis_server, tmp_path, speech_wav):
    jobs = make_jobs(redis_server, tmp_path, max_queued=2)
    for _ in range(2):
        create(jobs, speech_wav.read_bytes())
    with pytest.raises(QueueFullError) as exc:
        create(jobs, speech_wav.read_bytes())
    assert exc.value.retry_after_s == 7
    assert len(files(tmp_path)) == 2


def test_result_waits_for_completion_and_delete_removes_everything(
    redis_server, tmp_path, speech_wav
):
    jobs = make_jobs(redis_server, tmp_path)
    job_id = create(jobs, speech_wav.read_bytes()).record.id
    with pytest.raises(JobNotReadyError):
        jobs.result(job_id)
    # What a worker does: start, write the result, complete.
    jobs.store.start(job_id)
    with jobs.storage.writer(result_key(job_id)) as f:
        f.write(b'{"text": "hi"}')
    jobs.store.complete(job_id, {"result": result_key(job_id)})
    view = jobs.get(job_id)
    assert view.record.status == JobStatus.COMPLETED
    assert view.progress_seconds == pytest.approx(view.params.duration)
    assert jobs.result(job_id) == b'{"text": "hi"}'
    assert jobs.delete(job_id) == job_id
    assert files(tmp_path) == []
    for call in (jobs.get, jobs.result, jobs.delete):
        with pytest.raises(JobNotFoundError):
            call(job_id)


def test_ids_of_other_job_kinds_are_not_found(redis_server, tmp_path):
    jobs = make_jobs(redis_server, tmp_path)
    other = jobs.store.create("video", MODEL, {}, 60.0)
    with pytest.raises(JobNotFoundError):
        jobs.get(other.id)
    with pytest.raises(JobNotFoundError):
        jobs.delete(other.id)


def test_sweep_deletes_the_files_of_expired_jobs(redis_server, tmp_path, speech_wav):
    jobs = make_jobs(redis_server, tmp_path, ttl_s=0.2)
    job_id = create(jobs, speech_wav.read_bytes()).record.id
    assert files(tmp_path)
    time.sleep(0.3)
    assert jobs.sweep() == 1
    assert files(tmp_path) == [] and jobs.sweep() == 0
    with pytest.raises(JobNotFoundError):
        jobs.get(job_id)
