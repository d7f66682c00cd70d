"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's speech-to-text API
over the ASR services' gRPC API (``jacana.asr.v1.Asr``).

Request handling, in order: the multipart form (400 naming the field,
:mod:`jacana_gateway.schemas.audio`; a body over ``max_audio_body_bytes`` is a 413 from
the body limit), the model served here (404 ``model_not_found``; a generation or embedding
model is a 400 ``model_not_supported``), then the service: its INVALID_ARGUMENT -> 400
naming ``file``, ``language`` or ``temperature`` (audio past the service's length limit,
code ``audio_too_long``, points a transcription to the jobs route,
:mod:`jacana_gateway.routes.audio_jobs`), RESOURCE_EXHAUSTED -> 429,
DEADLINE_EXCEEDED -> 504, unreachable -> 503. A replica that answers UNAVAILABLE is
skipped for the next one (transcribing is idempotent). A client that disconnects cancels
the gRPC call. The reply is shown in the asked ``response_format``
(:mod:`jacana_gateway.translate.audio`).

With ``stream=true`` (transcriptions) the service's ``TranscribeStream`` is opened and its
first event awaited under the same disconnect watch, so every error above is still an HTTP
error; then an :class:`EventStreamResponse` sends OpenAI's transcript events
(:mod:`jacana_gateway.translate.audio_stream`). A failure after that is one
``data: {"error": {...}}`` event; a client that leaves cancels the call, which stops the
transcription at its next window.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from jacana_common.errors import ApiError
from jacana_gateway.backends.server_stream import ServerStream
from jacana_gateway.errors import model_not_found, model_not_supported
from jacana_gateway.middleware.disconnect import EventStreamResponse, cancel_on_disconnect
from jacana_gateway.middleware.metrics import label_model
from jacana_gateway.routes.generation import sse
from jacana_gateway.schemas.audio import RESPONSE_FORMATS, read_audio_request
from jacana_gateway.state import GatewayState
from jacana_gateway.translate import audio_stream
from jacana_gateway.translate.audio import RENDERERS, transcribe_request

AUDIO_TOO_LONG = "audio_too_long"  # the service's code for audio past its length limit
JOBS_PATH = "/v1/audio/transcriptions/jobs"  # long audio: jacana_gateway.routes.audio_jobs
LONG_AUDIO_HINT = f"Transcribe longer audio as a job: POST {JOBS_PATH}."


async def stream_events(stream: ServerStream) -> AsyncIterator[bytes]:
    """The SSE body of a streamed transcription; closes ``stream`` however it ends."""
    text = audio_stream.DeltaText()
    try:
        async for event in stream.messages():
            for openai_event in audio_stream.events(event, text):
                yield sse(openai_event)
    except ApiError as error:
        yield sse(error.to_dict())
    finally:
        stream.close()


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
            "items": {"type": "string", "enum": ["segment", "word"]},
        }
        properties["stream"] = {"type": "boolean", "description": "Server-sent events."}
        properties["include[]"] = {
            "type": "array",
            "items": {"type": "string", "enum": ["logprobs"]},
        }
    schema = {"type": "object", "required": ["file", "model"], "properties": properties}
    return {
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}
    }


def build_router(state: GatewayState) -> APIRouter:
    """``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` served by
    ``state.asr``."""
    router = APIRouter(prefix="/v1/audio", tags=["openai"])
    services, timeout_s = state.asr, state.settings.request_timeout_s

    async def serve(request: Request, task: str) -> Response:
        body = await read_audio_request(request, task)
        if body.model not in services:
            route = state.route_for(body.model)
            if route is None:
                raise model_not_found(body.model)
            raise model_not_supported(body.model, "not a speech-to-text model", route)
        label_model(request, body.model)
        service_request = transcribe_request(body, uuid.uuid4().hex)
        if body.stream:
            call = services.transcribe_stream(body.model, service_request, timeout_s)
        else:
            call = services.transcribe(body.model, service_request, timeout_s)
        reply = None
        try:
            async with cancel_on_disconnect(request.receive):
                reply = await call
        except ApiError as exc:
            if exc.code == AUDIO_TOO_LONG and task == "transcribe":
                message = f"{exc.message} {LONG_AUDIO_HINT}"
                raise ApiError(exc.status, message, exc.param, exc.code) from None
            raise
        except BaseException:
            if isinstance(reply, ServerStream):  # the client left just as it opened
                reply.close()
            raise
        if body.stream:
            return EventStreamResponse(stream_events(reply), on_close=[reply.close])
        rendered = RENDERERS[body.response_format](reply, task, body.timestamp_granularities)
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
