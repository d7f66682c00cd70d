"""/v1/audio/transcriptions/jobs: long audio transcribed as a job (a Jacana extension of
OpenAI's audio API), over the ASR services' job RPCs.

- ``POST /v1/audio/transcriptions/jobs``: the form of ``POST /v1/audio/transcriptions``
  (checked by :mod:`jacana_gateway.schemas.audio`: 400 naming the field, 413 past
  ``max_audio_body_bytes``); the job comes back at once, ``queued``. Its
  ``response_format`` is the result's default format.
- ``GET /v1/audio/transcriptions/jobs/{job_id}``: status and progress.
- ``GET /v1/audio/transcriptions/jobs/{job_id}/result?response_format=``: the result of a
  completed job, rendered as the synchronous route renders it
  (:mod:`jacana_gateway.translate.audio`); a job not completed is a 400 ``job_not_ready``.
- ``DELETE /v1/audio/transcriptions/jobs/{job_id}``: the job and its files are deleted; a
  queued job never runs, a running one stops.

The service's failures become OpenAI errors (:func:`jacana_gateway.backends.asr.job_error`):
429 with ``Retry-After`` when too many jobs wait, 404 for unknown ids, 503 when jobs are not
configured or the job store is unreachable. While a job is queued or in progress, GET
carries ``openai-poll-after-ms``, as GET /v1/videos/{id} does.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from jacana_common.errors import ApiError
from jacana_gateway.errors import ERROR_RESPONSES, model_not_found, model_not_supported
from jacana_gateway.middleware.disconnect import cancel_on_disconnect
from jacana_gateway.routes.audio import JOBS_PATH
from jacana_gateway.schemas.audio import RESPONSE_FORMATS, read_audio_request
from jacana_gateway.state import GatewayState
from jacana_gateway.translate.audio import RENDERERS
from jacana_gateway.translate.audio_jobs import create_job_request, job_deleted, job_object
from jacana_gateway.translate.videos import trace_context

T = TypeVar("T")

MAX_JOB_ID_CHARS = 256
ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]


def _form_schema() -> dict[str, Any]:
    """The multipart body in the OpenAPI document (the handler reads the form itself)."""
    properties: dict[str, Any] = {
        "file": {"type": "string", "format": "binary", "description": "The audio file."},
        "model": {"type": "string", "description": "A speech-to-text model id."},
        "language": {"type": "string", "description": "ISO-639-1 code of the speech."},
        "prompt": {"type": "string", "description": "Text that conditions the decoding."},
        "response_format": {
            "type": "string",
            "enum": list(RESPONSE_FORMATS),
            "description": "The result's default format.",
        },
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "timestamp_granularities[]": {
            "type": "array",
            "items": {"type": "string", "enum": ["segment", "word"]},
        },
    }
    schema = {"type": "object", "required": ["file", "model"], "properties": properties}
    return {
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}
    }


def build_router(state: GatewayState) -> APIRouter:
    """The transcription job routes served by ``state.asr``."""
    router = APIRouter(prefix=JOBS_PATH, tags=["jacana"])
    services, timeout_s = state.asr, state.settings.request_timeout_s

    def served(job_id: str) -> None:
        """Refuse an id no ASR service can know before calling anyone."""
        if not services.models or len(job_id) > MAX_JOB_ID_CHARS:
            raise ApiError(
                404, f"No transcription job with id '{job_id[:64]}'.", "job_id", "not_found"
            )

    async def call(request: Request, pending: Awaitable[T]) -> T:
        async with cancel_on_disconnect(request.receive):
            return await pending

    @router.post("", response_model=None, responses=ERROR_RESPONSES, openapi_extra=_form_schema())
    async def create_transcription_job(request: Request) -> JSONResponse:
        """Queue the transcription of an audio file; the job comes back ``queued``."""
        body = await read_audio_request(request, "transcribe")
        if body.model not in services:
            route = state.route_for(body.model)
            if route is None:
                raise model_not_found(body.model)
            raise model_not_supported(body.model, "not a speech-to-text model", route)
        grpc_request = create_job_request(body, uuid.uuid4().hex, trace_context(request.headers))
        job = await call(request, services.create_job(body.model, grpc_request, timeout_s))
        return JSONResponse(job_object(job))

    @router.get("/{job_id}", response_model=None, responses=ERROR_RESPONSES)
    async def retrieve_transcription_job(request: Request, job_id: str) -> JSONResponse:
        """A job's status and progress (seconds of audio done, of ``duration``)."""
        served(job_id)
        job = await call(request, services.get_job(job_id, timeout_s))
        return JSONResponse(job_object(job))

    @router.get("/{job_id}/result", response_model=None, responses=ERROR_RESPONSES)
    async def transcription_job_result(
        request: Request, job_id: str, response_format: ResponseFormat | None = None
    ) -> Response:
        """The transcription of a completed job, in ``response_format`` (default: the one
        given at creation, else json)."""
        served(job_id)
        if response_format is None:
            job = await call(request, services.get_job(job_id, timeout_s))
            response_format = job.response_format or "json"  # type: ignore[assignment]
        reply = await call(request, services.job_result(job_id, timeout_s))
        # A job keeps no granularities: its words are shown when the service timed them.
        shown = ("segment", "word") if any(s.words for s in reply.segments) else ()
        rendered = RENDERERS[response_format](reply, "transcribe", shown)
        return Response(rendered.content, media_type=rendered.media_type)

    @router.delete("/{job_id}", response_model=None, responses=ERROR_RESPONSES)
    async def delete_transcription_job(request: Request, job_id: str) -> JSONResponse:
        """Delete a job and its files; a queued job never runs, a running one stops."""
        served(job_id)
        reply = await call(request, services.delete_job(job_id, timeout_s))
        return JSONResponse(job_deleted(reply, job_id))

    return router
