"""Operational routes: /health (engine, embeddings, ASR and multimodal reachability),
/version and /metrics (Prometheus text format, :mod:`jacana_gateway.metrics`). Never
authenticated."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from jacana_gateway.errors import engine_unavailable
from jacana_gateway.state import GatewayState


def _models(kind: str, report: dict[str, dict[str, bool]]) -> dict[str, Any]:
    return {
        model: {
            "kind": kind,
            "healthy_replicas": sum(replicas.values()),
            "replicas": {t: "serving" if ok else "unavailable" for t, ok in replicas.items()},
        }
        for model, replicas in report.items()
    }


def build_router(state: GatewayState) -> APIRouter:
    """The operational routes of ``state``'s gateway."""
    router = APIRouter(tags=["operations"])

    @router.get("/metrics", response_model=None, include_in_schema=False)
    async def metrics() -> Response:
        """The gateway's Prometheus metrics."""
        body = generate_latest(state.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @router.get("/health", response_model=None)
    async def health() -> JSONResponse:
        """200 when every model (generation, embedding, speech-to-text, video) has at
        least one replica answering SERVING, else 503.

        The body lists each model's kind (``generation``, ``embeddings``, ``asr`` or
        ``video``),
        endpoints and whether they serve; on 503 it also carries an OpenAI error naming the
        models without a healthy replica.
        """
        timeout = state.settings.health_timeout_s
        engines, embeddings, asr, videos = await asyncio.gather(
            state.pool.health(timeout),
            state.embeddings.health(timeout),
            state.asr.health(timeout),
            state.videos.health(timeout),
        )
        models = {
            **_models("generation", engines),
            **_models("embeddings", embeddings),
            **_models("asr", asr),
            **_models("video", videos),
        }
        down = [m for m, info in models.items() if info["healthy_replicas"] == 0]
        if not down:
            return JSONResponse({"status": "ok", "models": models})
        error = engine_unavailable(f"No healthy replica for: {', '.join(down)}.")
        body = {**error.to_dict(), "status": "unavailable", "models": models}
        return JSONResponse(body, status_code=503)

    @router.get("/version")
    async def version() -> dict[str, str]:
        """The gateway's version."""
        return {"version": state.version}

    return router
