"""The transcription worker: ``celery -A jacana_asr.worker worker -Q jacana.transcription
--concurrency 1`` (the queue is ``AsrSettings.job_queue``).

``app`` is built on first access (module ``__getattr__``), from ``AsrSettings``, so
importing this module reads no settings and connects nowhere. Celery's prefork pool runs
the job in a child process: when that child dies mid-job the parent rejects the message
and the broker re-queues it (``task_reject_on_worker_lost`` with late acknowledgement);
when the whole worker dies, the broker re-delivers the message after its visibility
timeout. Either way ``jacana_jobs.run_job`` starts the job again from its record: the same
upload, the same options, the same result key. A job whose result was written before its
worker died completes from that result without transcribing again.

Per-process state: the loaded transcriber (``_transcriber``), kept for the life of the
pool process; nothing else outlives a task.
"""

from __future__ import annotations

import logging
from functools import cache

import redis
from celery import Celery

from jacana_asr.audio import AudioError, decode_audio
from jacana_asr.jobs import NAMESPACE, TRANSCRIBE_TASK, JobParams, result_key, upload_key
from jacana_asr.settings import AsrSettings
from jacana_asr.transcription import SAMPLE_RATE
from jacana_jobs import (
    ArtifactStorage,
    JobContext,
    JobFailure,
    JobStore,
    LocalStorage,
    job_worker_app,
    lazy_app,
)

log = logging.getLogger(__name__)


@cache
def _settings() -> AsrSettings:
    return AsrSettings.load()


@cache
def _store() -> JobStore:
    return JobStore(redis.Redis.from_url(_settings().redis_url), NAMESPACE)


@cache
def _storage() -> ArtifactStorage:
    return LocalStorage(_settings().storage_dir)


@cache
def _transcriber():
    """The model behind the voice-activity filter, loaded on first use in this process."""
    import torch

    from jacana_asr.transcriber import WhisperTranscriber
    from jacana_asr.vad import SileroVad
    from jacana_asr.vad_transcriber import VadTranscriber

    settings = _settings()
    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    log.info("loading %s from %s on %s", settings.model_id, settings.model, settings.device)
    transcriber = WhisperTranscriber(settings.model, settings.device)
    return VadTranscriber(transcriber, SileroVad(settings.vad_model), settings.vad_min_seconds)


def _read_upload(ctx: JobContext, storage: ArtifactStorage) -> bytes:
    try:
        with storage.open(upload_key(ctx.record.id)) as f:
            return f.read()
    except FileNotFoundError:
        ctx.check_cancelled()  # deleted meanwhile: its upload went with it
        raise JobFailure("upload_missing", "the uploaded audio is gone") from None


def transcribe_job(ctx: JobContext) -> dict[str, str]:
    """The task body: decode the upload, transcribe it, store the result as JSON, return
        its key. Progress is reported and cancellation (the job deleted) checked after each
    30-second window."""
    from google.protobuf import json_format

    from jacana_asr.server import encode_response

    settings = _settings()
    job_id = ctx.record.id
    if ctx.record.model != settings.model_id:
        raise JobFailure(
            "model_not_found", f"this worker serves {settings.model_id!r}, not {ctx.record.model!r}"
        )
    storage = _storage()
    key = result_key(job_id)
    if storage.exists(key):  # written before this job's previous worker died
        return {"result": key}
    params = JobParams.from_json(ctx.record.params)
    try:
        samples = decode_audio(
            _read_upload(ctx, storage),
            max_seconds=settings.max_job_audio_seconds,
            timeout_s=settings.decode_timeout_s,
            ffmpeg=settings.ffmpeg,
        )
    except AudioError as exc:
        raise JobFailure("invalid_audio", exc.message) from None
    duration = max(len(samples) / SAMPLE_RATE, 1e-9)

    def on_window(seconds_done: float) -> None:
        # Progress is kept in percent; the API shows it as seconds of audio done.
        ctx.progress(min(100.0, 100.0 * seconds_done / duration))
        ctx.check_cancelled()  # a deleted job stops at the next window

    on_window(0.0)
    result = _transcriber().transcribe(samples, params.options, on_window)
    payload = json_format.MessageToJson(
        encode_response(result, settings.model_id), preserving_proto_field_name=True
    )
    with storage.writer(key) as f:
        f.write(payload.encode())
    storage.delete(upload_key(job_id))
    return {"result": key}


def create_app(settings: AsrSettings | None = None) -> Celery:
    """The Celery app with the transcription task registered on ``settings.job_queue``."""
    settings = settings or _settings()
    if not settings.redis_url:
        raise ValueError("transcription jobs need Redis: set JACANA_ASR_REDIS_URL")
    return job_worker_app(
        "jacana_asr",
        settings.redis_url,
        settings.job_queue,
        settings,
        TRANSCRIBE_TASK,
        transcribe_job,
        store=_store,
        storage=_storage,
    )


# ``celery -A jacana_asr.worker`` finds ``app`` here, built on first use.
__getattr__ = lazy_app(create_app)
