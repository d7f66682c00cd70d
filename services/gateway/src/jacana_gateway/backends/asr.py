"""The speech-to-text services (``jacana.asr.v1.Asr``) behind /v1/audio/*: their replicas
per model, the ``Transcribe`` call and the transcription job calls routed over them.

``TranscribeStream`` opens like the engine's ``Generate``
(:mod:`jacana_gateway.backends.server_stream`): errors before the first event are HTTP
errors, an UNAVAILABLE replica is skipped while none has come.

A new job goes to a replica of its model; the calls by job id go to any replica (they
share one Redis job store, :mod:`jacana_gateway.backends.shared_store`). Every call moves
on to the next replica while one answers UNAVAILABLE: the service answers it only when it
wrote nothing (no Redis configured, Redis unreachable, no ffmpeg).

Job errors (:func:`job_error`): UNAVAILABLE is a 503 that names no internal address (the
details go to the log) but says so when jobs are not configured (code ``jobs_disabled``);
RESOURCE_EXHAUSTED a 429 with the service's ``retry-after``; every other status as
:func:`jacana_common.errors.api_error_from_grpc` shows it.
"""

from __future__ import annotations

import logging

import grpc

from jacana_common.errors import ApiError, api_error_from_grpc, parse_grpc_details
from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_common.pb.jacana.asr.v1 import asr_pb2_grpc
from jacana_gateway.backends.replica_pool import Replica, call_with_failover
from jacana_gateway.backends.server_stream import ServerStream, open_server_stream
from jacana_gateway.backends.shared_store import ANY_REPLICA, SharedStoreBackends
from jacana_gateway.backends.videos import retry_after
from jacana_gateway.errors import ApiErrorWithHeaders

log = logging.getLogger(__name__)

ASR_SERVICE = "jacana.asr.v1.Asr"
JOBS_DISABLED = "jobs_disabled"


def job_error(exc: grpc.aio.AioRpcError) -> ApiError:
    """A transcription job call's failure as the client sees it."""
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        message, _, error_code = parse_grpc_details(exc.details() or "")
        if error_code == JOBS_DISABLED:
            return ApiError(503, message, None, JOBS_DISABLED)
        log.warning("asr service unavailable for jobs: %s", exc.details())
        return ApiError(
            503,
            "The transcription job service is unreachable; retry later.",
            None,
            "service_unavailable",
        )
    error = api_error_from_grpc(code, exc.details())
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        headers = {"Retry-After": str(retry_after(exc))}
        return ApiErrorWithHeaders(error.status, error.message, error.param, error.code, headers)
    return error


def _stream_error(exc: grpc.aio.AioRpcError, replica: Replica) -> ApiError:
    return api_error_from_grpc(exc.code(), exc.details())


def _stream_ended_early() -> ApiError:
    return ApiError(
        503, "The speech-to-text service ended the stream without a result.", None, None
    )


class AsrBackends(SharedStoreBackends):
    """Model id -> ASR service replicas (a :class:`ReplicaPool`), and the calls routed
    over them: least in flight first, UNAVAILABLE replicas skipped."""

    service = ASR_SERVICE
    stub = asr_pb2_grpc.AsrStub

    async def transcribe(
        self, model: str, request: pb.TranscribeRequest, timeout: float
    ) -> pb.TranscribeResponse:
        """``Transcribe`` on the least busy replica. Raises :class:`ApiError`."""
        return await call_with_failover(self.pool, model, "Transcribe", request, timeout)

    async def transcribe_stream(
        self, model: str, request: pb.TranscribeRequest, timeout: float
    ) -> ServerStream:
        """``TranscribeStream`` on the least busy replica, its first event received; the
        caller closes it. Raises :class:`ApiError`."""
        return await open_server_stream(
            self.pool,
            model,
            "TranscribeStream",
            request,
            timeout,
            to_error=_stream_error,
            ended_early=_stream_ended_early,
        )

    async def _job_call(self, key: str, method: str, request, timeout: float):
        return await call_with_failover(
            self.pool, key, method, request, timeout, to_error=job_error
        )

    async def create_job(
        self, model: str, request: pb.CreateTranscriptionJobRequest, timeout: float
    ) -> pb.TranscriptionJob:
        """``CreateTranscriptionJob`` on a replica of ``model``. Raises :class:`ApiError`."""
        return await self._job_call(model, "CreateTranscriptionJob", request, timeout)

    async def get_job(self, job_id: str, timeout: float) -> pb.TranscriptionJob:
        request = pb.GetTranscriptionJobRequest(job_id=job_id)
        return await self._job_call(ANY_REPLICA, "GetTranscriptionJob", request, timeout)

    async def job_result(self, job_id: str, timeout: float) -> pb.TranscribeResponse:
        request = pb.GetTranscriptionJobRequest(job_id=job_id)
        return await self._job_call(ANY_REPLICA, "GetTranscriptionJobResult", request, timeout)

    async def delete_job(self, job_id: str, timeout: float) -> pb.DeleteTranscriptionJobResponse:
        request = pb.GetTranscriptionJobRequest(job_id=job_id)
        return await self._job_call(ANY_REPLICA, "DeleteTranscriptionJob", request, timeout)
