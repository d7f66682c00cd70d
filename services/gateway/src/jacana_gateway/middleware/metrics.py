"""Counts and times every HTTP request into :class:`~jacana_gateway.metrics.GatewayMetrics`.

A pure ASGI middleware, outermost of the gateway's own (so a request refused by auth or
the body limit is counted too). The route label is the matched route's path template
(``/v1/videos/{video_id}``), read from the scope after routing; an unmatched path is
``other``, so a scanner cannot grow the label set. The model label is what a handler
set with :func:`label_model` once it resolved a served model, else empty.

A request is counted when its response ends (the last body chunk of a stream) or when
the app raised: an unexpected exception counts as status 500 and in
``jacana_gateway_errors_total`` before it propagates to the 500 handler; a client that
left before any response counts as 499.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jacana_gateway.metrics import GatewayMetrics

UNMATCHED = "other"


def label_model(request: Request, model: str) -> None:
    """Label ``request``'s metrics with ``model`` (a model this gateway serves)."""
    request.state.metrics_model = model


class MetricsMiddleware:
    """Count and time the HTTP requests of ``app`` into ``metrics``."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 499  # nothing was answered: the client went away
        done = False

        def finish(code: int) -> None:
            nonlocal done
            if done:
                return
            done = True
            route = getattr(scope.get("route"), "path", UNMATCHED)
            model = scope.get("state", {}).get("metrics_model", "")
            m = self.metrics
            m.requests.labels(route, model, str(code)).inc()
            m.duration.labels(route, str(code)).observe(time.monotonic() - started)

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                finish(status)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_counted)
        except Exception:
            route = getattr(scope.get("route"), "path", UNMATCHED)
            self.metrics.errors.labels(route).inc()
            finish(500)
            raise
        finally:
            finish(status)
            self.metrics.in_flight.dec()
