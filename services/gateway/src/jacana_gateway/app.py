"""The FastAPI application: :func:`create_app` wires settings, backends, routes, middleware
and errors.

Nothing happens at import. The backends' channels open in the app's lifespan (on the
server's event loop) and close when it ends, after in-flight requests have drained.
Every route family (:mod:`jacana_gateway.routes`) is built the same way, from the app's
:class:`GatewayState`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from jacana_gateway import version
from jacana_gateway.backends.asr import AsrBackends
from jacana_gateway.backends.embeddings import EmbeddingsBackends
from jacana_gateway.backends.engine import engine_pool
from jacana_gateway.backends.videos import VideoBackends
from jacana_gateway.errors import install_error_handlers
from jacana_gateway.middleware.admission import Admission
from jacana_gateway.middleware.auth import BearerAuthMiddleware
from jacana_gateway.middleware.body_limit import BodyLimitMiddleware
from jacana_gateway.middleware.metrics import MetricsMiddleware
from jacana_gateway.routes import ROUTE_FAMILIES
from jacana_gateway.settings import GatewaySettings
from jacana_gateway.state import GatewayState


def create_app(settings: GatewaySettings) -> FastAPI:
    """A gateway app for ``settings``; serve it with any ASGI server that runs lifespan."""
    state = GatewayState(
        settings=settings,
        pool=engine_pool(settings.engines),
        admission=Admission(settings.max_in_flight),
        version=version(),
        started_at=int(time.time()),
        embeddings=EmbeddingsBackends(settings.embeddings),
        asr=AsrBackends(settings.asr),
        videos=VideoBackends(settings.videos),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.close()

    app = FastAPI(
        title="Jacana gateway",
        summary="OpenAI-compatible API in front of Jacana's engines.",
        version=state.version,
        lifespan=lifespan,
        # A body without Content-Type is read as JSON (curl users forget the header).
        strict_content_type=False,
    )
    app.state.gateway = state
    install_error_handlers(app)
    for family in ROUTE_FAMILIES:
        app.include_router(family.build_router(state))
    # Added last = runs first: authentication before reading any body.
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.max_body_bytes,
        prefix_limits={
            "/v1/audio/": settings.max_audio_body_bytes,
            "/v1/videos": settings.max_video_body_bytes,
        },
    )
    if settings.api_keys:
        app.add_middleware(BearerAuthMiddleware, keys=settings.api_keys)
    # Outermost: requests refused by auth or the body limit are counted too.
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    return app
