"""Refuse request bodies above ``max_body_bytes`` with an OpenAI-shaped 413.

A pure ASGI middleware: a declared ``Content-Length`` above the limit is refused before
anything is read; a chunked body is counted as it arrives and refused (through the app's
HTTPException handler, so still OpenAI-shaped) as soon as it passes the limit. Paths
under a prefix of ``prefix_limits`` get that prefix's limit instead (audio uploads are
larger than any JSON body).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jacana_gateway.errors import error_response, request_too_large


class BodyLimitMiddleware:
    """Cap the size of every HTTP request body at ``limit`` bytes, or at the limit of the
    longest prefix in ``prefix_limits`` that the path starts with."""

    def __init__(
        self, app: ASGIApp, limit: int, prefix_limits: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.limit = limit
        # longest prefix first, so the most specific one decides
        self.prefix_limits = sorted((prefix_limits or {}).items(), key=lambda p: -len(p[0]))

    def limit_for(self, path: str) -> int:
        return next((n for prefix, n in self.prefix_limits if path.startswith(prefix)), self.limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await error_response(request_too_large(limit))(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, request_too_large(limit).message)
            return message

        await self.app(scope, counting_receive, send)
