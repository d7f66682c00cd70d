"""The job RPCs of ``jacana.asr.v1.Asr`` (long audio) on top of :class:`AsrServicer`.

:class:`AsrJobServicer` adds CreateTranscriptionJob, GetTranscriptionJob,
GetTranscriptionJobResult and DeleteTranscriptionJob over a :class:`TranscriptionJobs`
(or over nothing, when no Redis is configured: every job RPC then answers UNAVAILABLE with
code ``jobs_disabled``). Each call runs the blocking job method on a thread and maps the
errors to one status each, with the blamed field in the details: ``QueueFullError`` ->
RESOURCE_EXHAUSTED with trailing metadata ``retry-after``, ``JobNotReadyError`` ->
FAILED_PRECONDITION, Redis unreachable -> UNAVAILABLE. Anything else is a bug: logged with
its traceback and answered INTERNAL. Owns no state beyond its references.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

import grpc
import redis

from jacana_asr.errors import (
    AsrError,
    InvalidRequestError,
    JobNotFoundError,
    JobNotReadyError,
    JobsDisabledError,
    ModelNotFoundError,
    OverloadedError,
    QueueFullError,
)
from jacana_asr.jobs import CreateJob, JobView, TranscriptionJobs
from jacana_asr.server import AsrServicer, decode_options
from jacana_asr.service import TranscriptionService
from jacana_common.errors import grpc_details
from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb

log = logging.getLogger(__name__)

T = TypeVar("T")

_STATUS = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFoundError: grpc.StatusCode.NOT_FOUND,
    JobNotFoundError: grpc.StatusCode.NOT_FOUND,
    JobNotReadyError: grpc.StatusCode.FAILED_PRECONDITION,
    QueueFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    OverloadedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    JobsDisabledError: grpc.StatusCode.UNAVAILABLE,
}
JOBS_DISABLED = JobsDisabledError(
    "Transcription jobs are not enabled on this server: its speech-to-text service has no "
    "Redis (JACANA_ASR_REDIS_URL).",
    None,
    "jobs_disabled",
)


def job_message(view: JobView) -> pb.TranscriptionJob:
    record, params = view.record, view.params
    message = pb.TranscriptionJob(
        id=record.id,
        model=record.model,
        # A deleted job is gone at once; between the two it reads as failed.
        status="failed" if record.status.value == "cancelled" else record.status.value,
        progress_seconds=view.progress_seconds,
        duration=params.duration,
        created_at=int(record.created_at),
        expires_at=int(record.expires_at),
        response_format=params.response_format,
        language=params.options.language or "",
    )
    if record.completed_at is not None:
        message.completed_at = int(record.completed_at)
    if record.error is not None:
        message.error.CopyFrom(
            pb.TranscriptionJobError(code=record.error.code, message=record.error.message)
        )
    return message


class AsrJobServicer(AsrServicer):
    """``jacana.asr.v1.Asr`` with its job RPCs; ``jobs`` None: jobs are disabled."""

    def __init__(self, service: TranscriptionService, jobs: TranscriptionJobs | None) -> None:
        super().__init__(service)
        self.jobs = jobs

    async def _call(self, context: grpc.aio.ServicerContext, fn: Callable[..., T], *args) -> T:
        try:
            if self.jobs is None:
                raise JOBS_DISABLED
            return await asyncio.to_thread(fn, *args)
        except AsrError as exc:
            if isinstance(exc, QueueFullError):
                context.set_trailing_metadata((("retry-after", str(exc.retry_after_s)),))
            status = _STATUS.get(type(exc), grpc.StatusCode.INTERNAL)
            await context.abort(status, grpc_details(exc.message, exc.param, exc.code))
        except redis.RedisError as exc:
            log.warning("redis unavailable: %s", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"job store unavailable: {exc}")
        except Exception:
            log.exception("%s failed", getattr(fn, "__name__", fn))
            await context.abort(grpc.StatusCode.INTERNAL, "internal error in the job service")
        raise AssertionError("unreachable")  # abort raises

    async def GetModelInfo(self, request, context):
        info = await super().GetModelInfo(request, context)
        if self.jobs is not None:
            info.max_job_audio_seconds = self.jobs.max_audio_seconds
        return info

    async def CreateTranscriptionJob(self, request: pb.CreateTranscriptionJobRequest, context):
        inner = request.request

        def create() -> JobView:
            return self.jobs.create(
                CreateJob(
                    audio=inner.audio,
                    options=decode_options(inner),
                    model=inner.model,
                    filename=inner.filename,
                    request_id=inner.request_id,
                    response_format=request.response_format,
                    trace_context=dict(request.trace_context),
                )
            )

        return job_message(await self._call(context, create))

    async def GetTranscriptionJob(self, request: pb.GetTranscriptionJobRequest, context):
        view = await self._call(context, lambda: self.jobs.get(request.job_id))
        return job_message(view)

    async def GetTranscriptionJobResult(self, request: pb.GetTranscriptionJobRequest, context):
        from google.protobuf import json_format

        payload = await self._call(context, lambda: self.jobs.result(request.job_id))
        return json_format.Parse(payload, pb.TranscribeResponse())

    async def DeleteTranscriptionJob(self, request: pb.GetTranscriptionJobRequest, context):
        job_id = await self._call(context, lambda: self.jobs.delete(request.job_id))
        return pb.DeleteTranscriptionJobResponse(job_id=job_id, deleted=True)
