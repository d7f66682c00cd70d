"""Refuse request bodies above ``max_body_bytes`` with an OpenAI-shaped 413.

A pure ASGI middleware: a declared ``Content-Length`` above the limit is refused before
anything is read; a chunked body is counted as it arrives and refused (through the app's
HTTPException handler, so still OpenAI-shaped) as soon as it passes the limit.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jacana_common.errors import ApiError
from jacana_gateway.errors import error_response


def too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"The request body is larger than {limit} bytes.", None, "request_too_large"
    )


class BodyLimitMiddleware:
    """Cap the size of every HTTP request body at ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            await error_response(too_large(self.limit))(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise HTTPException(413, too_large(self.limit).message)
            return message

        await self.app(scope, counting_receive, send)
