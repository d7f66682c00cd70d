"""Bearer-token authentication of the OpenAI routes (``/v1/...``).

A pure ASGI middleware, so it runs before body parsing: an unauthenticated client gets
401 whatever it sent. ``/health``, ``/version`` and the OpenAPI pages stay open (probes
and humans reading the schema carry no key). Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from jacana_gateway.errors import error_response, invalid_api_key

PROTECTED_PREFIX = "/v1/"


class BearerAuthMiddleware:
    """Reject ``/v1/*`` requests whose ``Authorization: Bearer`` is not one of ``keys``."""

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        self.app = app
        self._keys = [k.encode() for k in keys]

    def _allowed(self, header: str | None) -> bool:
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        presented = token.strip().encode()
        # Compare with every key (no early exit) so timing says nothing about which matched.
        matches = [hmac.compare_digest(presented, key) for key in self._keys]
        return any(matches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PROTECTED_PREFIX):
            await self.app(scope, receive, send)
            return
        if self._allowed(Headers(scope=scope).get("authorization")):
            await self.app(scope, receive, send)
            return
        response = error_response(invalid_api_key(), headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
