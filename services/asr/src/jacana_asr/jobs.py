"""Transcription jobs (long audio), independent of gRPC: create, read, result, delete, and
the sweep of expired files.

``TranscriptionJobs`` owns no job state: records live in Redis (``jacana_jobs.JobStore``,
kind "transcription", namespace :data:`NAMESPACE`), the upload and the result in the
artifact storage (keys from :func:`upload_key` and :func:`result_key`), queued jobs in the
Celery broker. So any number of service replicas may serve one Redis, and a restarted
service loses nothing. Every method blocks (Redis, ffmpeg); the gRPC front calls them on threads.

Invariants: an upload is checked (decoded once, here, so a bad file is a 400 at once and
the duration is known) before anything is written; a job is queued on the broker only after
its record and its upload exist; a create that is refused leaves nothing behind; deleting a
job removes its record at once (a running worker notices at its next check) and then its
files.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from jacana_asr.audio import AudioError, decode_audio, duration_seconds
from jacana_asr.errors import (
    InvalidRequestError,
    JobNotFoundError,
    JobNotReadyError,
    ModelNotFoundError,
    QueueFullError,
)
from jacana_asr.service import audio_error, check_options
from jacana_asr.transcription import TranscribeOptions
from jacana_jobs import ArtifactStorage, JobNotFound, JobRecord, JobStatus, JobStore, enqueue_job
from jacana_jobs.celery_app import queue_length
from jacana_jobs.metrics import JobMetricsCollector

log = logging.getLogger(__name__)

JOB_KIND = "transcription"
# Redis key prefix of the job records: apart from the video jobs' when they share a Redis,
# so each service's sweeper sees only its own expired jobs.
NAMESPACE = "jacana:transcriptions"
TRANSCRIBE_TASK = "jacana.transcription.transcribe"
# Uploads decoded at once to check them: each holds its samples (up to hours) in memory.
CHECKS_AT_ONCE = 2


def upload_key(job_id: str) -> str:
    """The file as uploaded (the worker decodes it again)."""
    return f"transcriptions/{job_id}/upload"


def result_key(job_id: str) -> str:
    """The result: ``TranscribeResponse`` in protobuf's JSON form."""
    return f"transcriptions/{job_id}/result.json"


@dataclass(frozen=True)
class JobParams:
    """What a job asks for, stored in its record: the decoding choices, the upload's name
    and length, and the result format the client asked for by default."""

    options: TranscribeOptions
    duration: float
    filename: str = ""
    request_id: str = ""
    response_format: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "options": dataclasses.asdict(self.options),
            "duration": self.duration,
            "filename": self.filename,
            "request_id": self.request_id,
            "response_format": self.response_format,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobParams:
        return cls(
            options=TranscribeOptions(**data["options"]),
            duration=float(data["duration"]),
            filename=data.get("filename", ""),
            request_id=data.get("request_id", ""),
            response_format=data.get("response_format", ""),
        )


@dataclass(frozen=True)
class JobView:
    """A job as the API shows it. A deleted job is gone at once, so ``status`` is queued,
    in_progress, completed or failed."""

    record: JobRecord
    params: JobParams

    @property
    def progress_seconds(self) -> float:
        """Seconds of audio done: the record's percentage of the upload's duration."""
        return self.params.duration * self.record.progress / 100.0


@dataclass(frozen=True)
class CreateJob:
    """A create as the service receives it (the gRPC message, decoded)."""

    audio: bytes
    options: TranscribeOptions
    model: str = ""
    filename: str = ""
    request_id: str = ""
    response_format: str = ""
    trace_context: dict[str, str] | None = None


def _no_job(job_id: str) -> JobNotFoundError:
    return JobNotFoundError(f"No transcription job found with id '{job_id}'.", "job_id")


class TranscriptionJobs:
    """The job API over one Redis and one artifact storage, for the model ``model_id``."""

    def __init__(
        self,
        client: redis.Redis,
        storage: ArtifactStorage,
        celery: Celery,
        *,
        model_id: str,
        queue: str,
        ttl_s: float,
        max_queued: int,
        retry_after_s: int,
        max_audio_seconds: float,
        decode_timeout_s: float,
        ffmpeg: str = "ffmpeg",
    ) -> None:
        self._redis = client
        self.store = JobStore(client, NAMESPACE)
        self.storage = storage
        self._celery = celery
        self.model_id = model_id
        self._queue = queue
        self._ttl_s = ttl_s
        self._max_queued = max_queued
        self._retry_after_s = retry_after_s
        self.max_audio_seconds = max_audio_seconds
        self._decode_timeout_s = decode_timeout_s
        self._ffmpeg = ffmpeg
        self._checks = threading.BoundedSemaphore(CHECKS_AT_ONCE)

    # -- reads -------------------------------------------------------------------------

    def metrics(self) -> JobMetricsCollector:
        """The transcription queue's metrics (``jacana_asr_queue_length``, ``…_jobs``,
        ``…_job_duration_seconds``), read from Redis at scrape time."""
        return JobMetricsCollector(self._redis, self.store, JOB_KIND, self._queue, "jacana_asr")

    def _record(self, job_id: str) -> JobRecord:
        try:
            record = self.store.get(job_id)
        except JobNotFound:
            raise _no_job(job_id) from None
        if record.kind != JOB_KIND:
            raise _no_job(job_id)
        return record

    def get(self, job_id: str) -> JobView:
        record = self._record(job_id)
        return JobView(record, JobParams.from_json(record.params))

    def result(self, job_id: str) -> bytes:
        """The stored result (``TranscribeResponse`` as JSON) of a completed job."""
        record = self._record(job_id)
        if record.status != JobStatus.COMPLETED:
            raise JobNotReadyError(
                f"Transcription job '{job_id}' is {record.status.value}; its result is "
                "available once it is completed.",
                "job_id",
                "job_not_ready",
            )
        try:
            with self.storage.open(record.artifacts.get("result", result_key(job_id))) as f:
                return f.read()
        except FileNotFoundError:
            raise _no_job(job_id) from None

    # -- writes ------------------------------------------------------------------------

    def create(self, request: CreateJob) -> JobView:
        """Check the request and the upload, store both, queue the job."""
        if request.model and request.model != self.model_id:
            raise ModelNotFoundError(
                f"model {request.model!r} is not served here (this service serves "
                f"{self.model_id!r})",
                "model",
            )
        options = check_options(request.options)
        if options.task != "transcribe":
            raise InvalidRequestError("jobs transcribe; translation is not offered", "task")
        waiting = queue_length(self._redis, self._queue)
        if waiting >= self._max_queued:
            raise QueueFullError(
                f"{waiting} transcription jobs are waiting already; try again later.",
                self._retry_after_s,
            )
        duration = self._check_upload(request.audio)
        params = JobParams(
            options=options,
            duration=duration,
            filename=request.filename,
            request_id=request.request_id,
            response_format=request.response_format,
        )
        record = self.store.create(JOB_KIND, self.model_id, params.to_json(), self._ttl_s)
        try:
            with self.storage.writer(upload_key(record.id)) as f:
                f.write(request.audio)
            enqueue_job(
                self._celery,
                TRANSCRIBE_TASK,
                record.id,
                headers=request.trace_context,
                queue=self._queue,
            )
        except BaseException:
            self.store.delete(record.id)
            self.storage.delete(upload_key(record.id))
            raise
        log.info("transcription %s queued (%.1f s of audio)", record.id, duration)
        return JobView(record, params)

    def _check_upload(self, audio: bytes) -> float:
        """The upload's duration in seconds; InvalidRequestError (``file``) when it is not
        audio or longer than ``max_audio_seconds``."""
        with self._checks:
            try:
                samples = decode_audio(
                    audio,
                    max_seconds=self.max_audio_seconds,
                    timeout_s=self._decode_timeout_s,
                    ffmpeg=self._ffmpeg,
                )
            except AudioError as exc:
                raise audio_error(exc) from None
            return duration_seconds(samples)

    def delete(self, job_id: str) -> str:
        """Remove the job (a running worker stops at its next check) and its files."""
        self._record(job_id)  # 404 for ids of other kinds
        try:
            keys = self.store.delete(job_id)
        except JobNotFound:
            raise _no_job(job_id) from None
        for key in {*keys, upload_key(job_id), result_key(job_id)}:
            self.storage.delete(key)
        return job_id

    # -- expiry ------------------------------------------------------------------------

    def sweep(self, limit: int = 100) -> int:
        """Delete the files of expired jobs; return how many jobs were swept."""
        expired = self.store.expired_artifacts(limit=limit)
        for job in expired:
            for key in {*job.artifacts, upload_key(job.id), result_key(job.id)}:
                self.storage.delete(key)
            self.store.forget(job)
        if expired:
            log.info("swept %d expired transcription jobs", len(expired))
        return len(expired)
