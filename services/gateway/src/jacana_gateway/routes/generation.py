"""POST /v1/chat/completions and /v1/completions: check, translate, admit, call the
engine, answer as JSON or as SSE.

Order of checks: body shape and types (400, by FastAPI and
:mod:`jacana_gateway.schemas`), model exists (404 ``model_not_found``; an embedding model
or a speech-to-text model is a 400 ``model_not_supported``), unsupported features (400,
:mod:`jacana_gateway.translate.unsupported`), gateway limits (400,
:mod:`jacana_gateway.translate.generation_request`), admission (429), then the engine (its
INVALID_ARGUMENT -> 400 with its param, unreachable -> 503).

Lifecycle of a request (all on the event loop):
1. the handler has validated the body and built the engine request;
2. :func:`serve` takes an admission slot (429 if none), opens the engine stream and waits
   for its first message while watching for a client disconnect;
3. non-streaming: the whole stream is collected, still under the disconnect watch;
   streaming: an :class:`EventStreamResponse` sends ``data: {chunk}\\n\\n`` events and
   ``data: [DONE]\\n\\n``. A failure after the first byte is sent as one
   ``data: {"error": {...}}`` event before ``[DONE]``.
The engine call is cancelled and the slot released on every path.

Choices: one engine call carries all of a request's choices (its messages say which
``index`` they belong to); the response is complete once every choice has finished. For
``best_of`` the engine runs ``best_of`` choices and :func:`collect` keeps the ``keep``
with the highest mean token logprob, renumbered from 0 (never streamed); usage counts
every choice that ran.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from jacana_common.errors import ApiError
from jacana_common.metrics import RequestTimer
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_gateway.backends.engine import EngineStream, open_stream
from jacana_gateway.errors import (
    ERROR_RESPONSES,
    engine_error,
    model_not_found,
    model_not_supported,
)
from jacana_gateway.metrics import TimedStream
from jacana_gateway.middleware.disconnect import EventStreamResponse, cancel_on_disconnect
from jacana_gateway.middleware.metrics import label_model
from jacana_gateway.schemas.chat import ChatCompletionRequest
from jacana_gateway.schemas.generation import CompletionRequest, GenerationRequest
from jacana_gateway.state import GatewayState
from jacana_gateway.translate import generation_request, sampling, unsupported
from jacana_gateway.translate.generation_response import (
    Choice,
    Envelope,
    Format,
    usage_chunk,
    usage_of,
)
from jacana_gateway.translate.logprobs import mean_logprob

DONE = b"data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _ended_early() -> ApiError:
    return engine_error("The engine ended the stream without finishing.")


def _choice_of(choices: dict[int, Choice], message: pb.GenerateResponse) -> Choice:
    choice = choices.get(message.index)
    if choice is None:
        raise engine_error("The engine sent an unknown choice index.")
    return choice


def _usage(choices: dict[int, Choice]) -> dict[str, Any]:
    if any(c.usage is None for c in choices.values()):
        raise _ended_early()
    return usage_of([c.usage for c in choices.values()])


async def collect(
    stream: EngineStream | TimedStream,
    fmt: Format,
    env: Envelope,
    n: int = 1,
    keep: int | None = None,
) -> dict[str, Any]:
    """Read all ``n`` choices of the stream into one response object; with ``keep`` < n,
    only the ``keep`` best (by mean token logprob) are answered."""
    choices = {i: Choice(i) for i in range(n)}
    async for message in stream.messages():
        _choice_of(choices, message).add(message)
    used = _usage(choices)
    answered = list(choices.values())
    if keep is not None and keep < n:
        answered.sort(key=lambda c: mean_logprob(c.logprobs), reverse=True)
        answered = answered[:keep]
        for i, choice in enumerate(answered):
            choice.index = i
    return fmt.response(env, answered, used)


async def events(
    stream: EngineStream | TimedStream, fmt: Format, env: Envelope, include_usage: bool, n: int = 1
) -> AsyncIterator[bytes]:
    """The SSE body of a streaming response; closes ``stream`` however it ends."""

    def chunk(obj: dict[str, Any]) -> bytes:
        return sse({**obj, "usage": None} if include_usage else obj)

    try:
        choices = {i: Choice(i) for i in range(n)}
        for i in range(n):
            for opening in fmt.opening_chunks(env, i):
                yield chunk(opening)
        async for message in stream.messages():
            choice = _choice_of(choices, message)
            first = not choice.started
            choice.add(message)
            for delta in fmt.delta_chunks(env, choice, message, first):
                yield chunk(delta)
            if choice.reason is not None:
                for closing in fmt.finish_chunks(env, choice):
                    yield chunk(closing)
        used = _usage(choices)
        if include_usage:
            yield sse(usage_chunk(fmt, env, used))
    except ApiError as error:
        yield sse(error.to_dict())
    finally:
        stream.close()
    yield DONE


async def serve(
    request: Request,
    state: GatewayState,
    fmt: Format,
    env: Envelope,
    engine_request: pb.GenerateRequest,
    *,
    stream: bool,
    include_usage: bool,
    keep: int | None = None,
    timer: RequestTimer | None = None,
) -> Response:
    """Run ``engine_request`` on ``env.model``'s engines and answer the HTTP request
    (``keep``: answer only the best ``keep`` of its choices; never with ``stream``).
    ``timer`` (started when the request arrived) times the generation for the metrics."""
    n = max(engine_request.sampling.n, 1)
    timer = timer or RequestTimer(state.metrics.latency, (env.model,))
    slot = state.admission.admit()
    headers = {"X-Request-Id": env.id}
    handed_off = False  # True once the streaming response owns the slot and the call
    try:
        async with cancel_on_disconnect(request.receive):
            opened = await open_stream(
                state.pool, env.model, engine_request, state.settings.request_timeout_s
            )
            engine = state.metrics.timed(opened, env.model, timer)
            if stream:
                body = events(engine, fmt, env, include_usage, n)
                handed_off = True
                return EventStreamResponse(
                    body, on_close=[engine.close, slot.release], headers=headers
                )
            try:
                answer = await collect(engine, fmt, env, n, keep)
                return JSONResponse(answer, headers=headers)
            finally:
                engine.close()
    except BaseException:
        if handed_off:  # the client left just as the response was made: it will not run
            engine.close()
            handed_off = False
        raise
    finally:
        if not handed_off:
            slot.release()


_GENERATION_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A completion object, or with stream=true a text/event-stream of chunks.",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


async def _generate(
    request: Request,
    state: GatewayState,
    body: GenerationRequest,
    check: Callable[[Any], None],
    build: Callable[..., pb.GenerateRequest],
) -> Response:
    timer = RequestTimer(state.metrics.latency, (body.model,))
    if body.model not in state.pool:
        route = state.route_for(body.model)
        if route is None:
            raise model_not_found(body.model)
        kind = "an embedding" if body.model in state.embeddings else "a speech-to-text"
        raise model_not_supported(body.model, f"{kind} model", route)
    label_model(request, body.model)
    check(body)
    fmt = sampling.response_format(body)
    env = Envelope(fmt.new_id(), int(time.time()), body.model, state.system_fingerprint)
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
        keep=sampling.kept_choices(body),
        timer=timer,
    )


def build_router(state: GatewayState) -> APIRouter:
    """``POST /v1/chat/completions`` and ``/v1/completions`` served by ``state.pool``."""
    router = APIRouter(prefix="/v1", tags=["openai"])
    responses = {**_GENERATION_OK, **ERROR_RESPONSES}

    @router.post("/chat/completions", response_model=None, responses=responses)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """Chat completion; the engine applies the model's chat template."""
        return await _generate(
            request, state, body, unsupported.check_chat, generation_request.chat_request
        )

    @router.post("/completions", response_model=None, responses=responses)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """Text completion of a prompt (text or token ids)."""
        return await _generate(
            request,
            state,
            body,
            unsupported.check_completion,
            generation_request.completion_request,
        )

    return router
