"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's speech-to-text API
over the ASR services' gRPC API (``jacana.asr.v1.Asr``).

Self-contained like :mod:`embeddings_route`: :func:`audio_router` returns an
``APIRouter`` whose lifespan opens one grpc.aio channel per endpoint of
``model -> [host:port, ...]`` and closes them at shutdown.

Request handling, in order: the multipart form (400 naming the field,
:mod:`audio_form`; a body over ``max_audio_body_bytes`` is a 413 from the body limit),
the model served here (404 ``model_not_found``; a generation or embedding model is a 400
``model_not_supported``), then the service: its INVALID_ARGUMENT -> 400 naming ``file``,
``language`` or ``temperature``, RESOURCE_EXHAUSTED -> 429, DEADLINE_EXCEEDED -> 504,
unreachable -> 503. A replica that answers UNAVAILABLE is skipped for the next one
(transcribing is idempotent). A client that disconnects cancels the gRPC call. The
reply is shown in the asked ``response_format`` (:mod:`audio_formats`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from jacana_common.errors import ApiError
from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_common.pb.jacana.asr.v1 import asr_pb2_grpc
from jacana_gateway.audio_form import RESPONSE_FORMATS, AudioRequest, read_audio_request
from jacana_gateway.audio_formats import RENDERERS
from jacana_gateway.disconnect import cancel_on_disconnect
from jacana_gateway.replica_pool import ServiceBackends, call_with_failover

ASR_SERVICE = "jacana.asr.v1.Asr"
_TASKS = {"transcribe": pb.TASK_TRANSCRIBE, "translate": pb.TASK_TRANSLATE}


class AsrBackends(ServiceBackends):
    """Model id -> ASR service replicas (a :class:`ReplicaPool`), and ``Transcribe`` calls
    routed over them: least in flight first, UNAVAILABLE replicas skipped."""

    service = ASR_SERVICE
    stub = asr_pb2_grpc.AsrStub

    async def transcribe(
        self, model: str, request: pb.TranscribeRequest, timeout: float
    ) -> pb.TranscribeResponse:
        """``Transcribe`` on the least busy replica. Raises :class:`ApiError`."""
        return await call_with_failover(self.pool, model, "Transcribe", request, timeout)


def grpc_request(body: AudioRequest, request_id: str) -> pb.TranscribeRequest:
    """``body`` as the service's TranscribeRequest. No ``model``: the gateway's name for
    the model may differ from the service's."""
    return pb.TranscribeRequest(
        request_id=request_id,
        audio=body.audio,
        filename=body.filename,
        language=body.language or "",
        task=_TASKS[body.task],
        prompt=body.prompt or "",
        temperature=body.temperature,
    )


def _model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model '{model}' does not exist.", "model", "model_not_found")


def _form_schema(task: str) -> dict[str, Any]:
    """The multipart body in the OpenAPI document (the handler reads the form itself)."""
    properties: dict[str, Any] = {
        "file": {"type": "string", "format": "binary", "description": "The audio file."},
        "model": {"type": "string", "description": "A speech-to-text model id."},
        "language": {"type": "string", "description": "ISO-639-1 code of the speech."},
        "prompt": {"type": "string", "description": "Text that conditions the decoding."},
        "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS)},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    }
    if task == "transcribe":
        properties["timestamp_granularities[]"] = {
            "type": "array",
            "items": {"type": "string", "enum": ["segment"]},
        }
    schema = {"type": "object", "required": ["file", "model"], "properties": properties}
    return {
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}
    }


def audio_router(
    backends: AsrBackends | Mapping[str, Sequence[str]],
    *,
    timeout_s: float = 600.0,
    other_kind: Callable[[str], str | None] = lambda model: None,
) -> APIRouter:
    """``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` served by
    ``backends`` (or a ``model -> endpoints`` mapping).

    timeout_s: the deadline of one Transcribe call. other_kind: for a model this router
    does not serve, the route that does (``"/v1/chat/completions"``...), or None.
    """
    pool = backends if isinstance(backends, AsrBackends) else AsrBackends(backends)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        try:
            yield
        finally:
            await pool.close()

    router = APIRouter(prefix="/v1/audio", tags=["openai"], lifespan=lifespan)

    async def serve(request: Request, task: str) -> Response:
        body = await read_audio_request(request, task)
        if body.model not in pool:
            route = other_kind(body.model)
            if route is None:
                raise _model_not_found(body.model)
            raise ApiError(
                400,
                f"The model '{body.model}' is not a speech-to-text model; use {route}.",
                "model",
                "model_not_supported",
            )
        call = pool.transcribe(body.model, grpc_request(body, uuid.uuid4().hex), timeout_s)
        async with cancel_on_disconnect(request.receive):
            reply = await call
        rendered = RENDERERS[body.response_format](reply, task)
        return Response(rendered.content, media_type=rendered.media_type)

    @router.post("/transcriptions", response_model=None, openapi_extra=_form_schema("transcribe"))
    async def create_transcription(request: Request) -> Response:
        """The speech of an audio file as text, in the language spoken."""
        return await serve(request, "transcribe")

    @router.post("/translations", response_model=None, openapi_extra=_form_schema("translate"))
    async def create_translation(request: Request) -> Response:
        """The speech of an audio file as English text."""
        return await serve(request, "translate")

    return router
