"""The OpenAI routes: /v1/chat/completions, /v1/completions, /v1/models (every served
model, embedding and speech-to-text models included; /v1/embeddings lives in
:mod:`embeddings_route`, /v1/audio/* in :mod:`audio_route`).

Order of checks for a generation request: body shape and types (400, by FastAPI and
:mod:`jacana_gateway.schemas`), model exists (404 ``model_not_found``; an embedding model
or a speech-to-text model is a 400 ``model_not_supported``), unsupported features (400,
:mod:`jacana_gateway.unsupported`), gateway limits (400, :mod:`jacana_gateway.translate`),
admission (429), then the engine (its INVALID_ARGUMENT -> 400 with its param, unreachable
-> 503).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from jacana_common.errors import ApiError
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_gateway import sampling_surface, translate, unsupported
from jacana_gateway.completions import serve
from jacana_gateway.formats import Envelope
from jacana_gateway.schemas import ChatCompletionRequest, CompletionRequest
from jacana_gateway.state import GatewayState


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """The OpenAI error object every failure is reported in."""

    error: ErrorDetail


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (400, 401, 404, 413, 429, 503, 504)
}
_GENERATION_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A completion object, or with stream=true a text/event-stream of chunks.",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


def _state(request: Request) -> GatewayState:
    return request.app.state.gateway


def _model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model '{model}' does not exist.", "model", "model_not_found")


def _envelope(state: GatewayState, request_id: str, model: str) -> Envelope:
    return Envelope(request_id, int(time.time()), model, state.system_fingerprint)


def _model_card(state: GatewayState, model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": state.started_at, "owned_by": "jacana"}


async def _generate(
    request: Request,
    body: Any,
    check: Callable[[Any], None],
    build: Callable[..., pb.GenerateRequest],
) -> Response:
    state = _state(request)
    if body.model not in state.pool:
        route = state.route_for(body.model)
        if route is None:
            raise _model_not_found(body.model)
        kind = "an embedding" if body.model in state.embeddings else "a speech-to-text"
        raise ApiError(
            400,
            f"The model '{body.model}' is {kind} model; use {route}.",
            "model",
            "model_not_supported",
        )
    check(body)
    fmt = sampling_surface.response_format(body)
    env = _envelope(state, fmt.new_id(), body.model)
    engine_request = build(
        body,
        env.id,
        max_prompt_chars=state.settings.max_prompt_chars,
        max_new_tokens=state.settings.max_new_tokens,
    )
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await serve(
        request,
        state,
        fmt,
        env,
        engine_request,
        stream=bool(body.stream),
        include_usage=include_usage,
        keep=sampling_surface.kept_choices(body),
    )


def build_router() -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["openai"])

    @router.post("/chat/completions", response_model=None, responses={**_GENERATION_OK, **_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """Chat completion; the engine applies the model's chat template."""
        return await _generate(request, body, unsupported.check_chat, translate.chat_request)

    @router.post("/completions", response_model=None, responses={**_GENERATION_OK, **_ERRORS})
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """Text completion of a prompt (text or token ids)."""
        return await _generate(
            request, body, unsupported.check_completion, translate.completion_request
        )

    @router.get("/models", responses=_ERRORS)
    async def list_models(request: Request) -> dict[str, Any]:
        """The served models: generation models, then embedding models, then
        speech-to-text models."""
        state = _state(request)
        return {"object": "list", "data": [_model_card(state, m) for m in state.models]}

    @router.get("/models/{model:path}", responses=_ERRORS)
    async def get_model(model: str, request: Request) -> dict[str, Any]:
        """One served model; 404 if it is not served here."""
        state = _state(request)
        if state.route_for(model) is None:
            raise _model_not_found(model)
        return _model_card(state, model)

    return router
