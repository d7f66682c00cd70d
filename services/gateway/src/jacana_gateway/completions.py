"""Serving one generation request: admit, call the engine, answer as JSON or as SSE.

Lifecycle of a request (all on the event loop):
1. the caller has validated the body and built the engine request;
2. :func:`serve` takes an admission slot (429 if none), opens the engine stream and waits
   for its first message while watching for a client disconnect;
3. non-streaming: the whole stream is collected, still under the disconnect watch;
   streaming: an :class:`EventStreamResponse` sends ``data: {chunk}\\n\\n`` events and
   ``data: [DONE]\\n\\n``. A failure after the first byte is sent as one
   ``data: {"error": {...}}`` event before ``[DONE]``.
The engine call is cancelled and the slot released on every path.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from jacana_common.errors import ApiError
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_gateway.disconnect import EventStreamResponse, cancel_on_disconnect
from jacana_gateway.engine_client import EngineStream, open_stream
from jacana_gateway.formats import Envelope, Format, finish_reason, usage, usage_chunk
from jacana_gateway.state import GatewayState

DONE = b"data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _finished(message: pb.GenerateResponse) -> str | None:
    if message.finish_reason == pb.FINISH_REASON_UNSPECIFIED:
        return None
    return finish_reason(message.finish_reason)


def _ended_early() -> ApiError:
    return ApiError(503, "The engine ended the stream without finishing.", None, "engine_error")


async def collect(stream: EngineStream, fmt: Format, env: Envelope) -> dict[str, Any]:
    """Read the whole stream into one response object."""
    parts: list[str] = []
    reason, used = None, None
    async for message in stream.messages():
        parts.append(message.text)
        if (done := _finished(message)) is not None:
            reason, used = done, usage(message.usage)
    if reason is None or used is None:
        raise _ended_early()
    return fmt.response(env, "".join(parts), reason, used)


async def events(
    stream: EngineStream, fmt: Format, env: Envelope, include_usage: bool
) -> AsyncIterator[bytes]:
    """The SSE body of a streaming response; closes ``stream`` however it ends."""

    def chunk(obj: dict[str, Any]) -> bytes:
        return sse({**obj, "usage": None} if include_usage else obj)

    try:
        for opening in fmt.opening_chunks(env):
            yield chunk(opening)
        reason, used = None, None
        async for message in stream.messages():
            if message.text:
                yield chunk(fmt.text_chunk(env, message.text))
            if (done := _finished(message)) is not None:
                reason, used = done, usage(message.usage)
        if reason is None or used is None:
            raise _ended_early()
        yield chunk(fmt.finish_chunk(env, reason))
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
) -> Response:
    """Run ``engine_request`` on ``env.model``'s engines and answer the HTTP request."""
    slot = state.admission.admit()
    headers = {"X-Request-Id": env.id}
    handed_off = False  # True once the streaming response owns the slot and the call
    try:
        async with cancel_on_disconnect(request.receive):
            engine = await open_stream(
                state.pool, env.model, engine_request, state.settings.request_timeout_s
            )
            if stream:
                body = events(engine, fmt, env, include_usage)
                handed_off = True
                return EventStreamResponse(
                    body, on_close=[engine.close, slot.release], headers=headers
                )
            try:
                return JSONResponse(await collect(engine, fmt, env), headers=headers)
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
