"""The FastAPI application: :func:`create_app` wires settings, engines, routes and errors.

Nothing happens at import. The engine channels open in the app's lifespan (on the
server's event loop) and close when it ends, after in-flight requests have drained.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from jacana_gateway import routes_ops, routes_v1, version
from jacana_gateway.admission import Admission
from jacana_gateway.audio_route import AsrBackends, audio_router
from jacana_gateway.auth import BearerAuthMiddleware
from jacana_gateway.body_limit import BodyLimitMiddleware
from jacana_gateway.config import GatewaySettings
from jacana_gateway.embeddings_route import EmbeddingsBackends, embeddings_router
from jacana_gateway.engine_client import engine_pool
from jacana_gateway.errors import install_error_handlers
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
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.pool.start()
        try:
            yield
        finally:
            await state.pool.close()

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
    app.include_router(routes_v1.build_router())
    app.include_router(routes_ops.build_router())
    # The router's lifespan opens and closes the embeddings channels; engine-served models
    # embed over the engine pool, which the app's lifespan owns.
    app.include_router(
        embeddings_router(
            state.embeddings, engines=state.pool, timeout_s=settings.request_timeout_s
        )
    )
    app.include_router(
        audio_router(state.asr, timeout_s=settings.request_timeout_s, other_kind=state.route_for)
    )
    # Added last = runs first: authentication before reading any body.
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.max_body_bytes,
        prefix_limits={"/v1/audio/": settings.max_audio_body_bytes},
    )
    if settings.api_keys:
        app.add_middleware(BearerAuthMiddleware, keys=settings.api_keys)
    return app
