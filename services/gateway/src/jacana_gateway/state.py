"""What one gateway app instance owns, reachable from handlers as ``app.state.gateway``
and handed to each route family's ``build_router``.

The backends' channels are opened by :meth:`GatewayState.start` on the server's event
loop (in the app's lifespan) and closed by :meth:`GatewayState.close` once in-flight
requests have drained.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from jacana_gateway.backends.asr import AsrBackends
from jacana_gateway.backends.embeddings import EmbeddingsBackends
from jacana_gateway.backends.replica_pool import ReplicaPool
from jacana_gateway.backends.videos import VideoBackends
from jacana_gateway.metrics import GatewayMetrics
from jacana_gateway.middleware.admission import Admission
from jacana_gateway.settings import GatewaySettings


@dataclass
class GatewayState:
    """Per-app state: settings, the engine pool, the embeddings, ASR and multimodal
    services, admission control, metrics, static facts. A model id is in at most one of
    ``pool``, ``embeddings``, ``asr`` and ``videos``."""

    settings: GatewaySettings
    pool: ReplicaPool
    admission: Admission
    version: str
    started_at: int
    embeddings: EmbeddingsBackends = field(default_factory=lambda: EmbeddingsBackends({}))
    asr: AsrBackends = field(default_factory=lambda: AsrBackends({}))
    videos: VideoBackends = field(default_factory=lambda: VideoBackends({}))
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)

    async def start(self) -> None:
        """Open the channels of every backend (connections are lazy: a service that is
        down does not fail start-up)."""
        backends = (self.pool, self.embeddings, self.asr, self.videos)
        await asyncio.gather(*(backend.start() for backend in backends))

    async def close(self) -> None:
        """Close every backend's channels; calls still open on them end with CANCELLED."""
        backends = (self.pool, self.embeddings, self.asr, self.videos)
        await asyncio.gather(*(backend.close() for backend in backends))

    @property
    def models(self) -> list[str]:
        """Every served model id: generation models first, then embedding models, then
        speech-to-text models, then video models."""
        return [*self.pool.models, *self.embeddings.models, *self.asr.models, *self.videos.models]

    def route_for(self, model: str) -> str | None:
        """The route that serves ``model`` (one of each kind's), or None when none does."""
        if model in self.pool:
            return "/v1/chat/completions"
        if model in self.embeddings:
            return "/v1/embeddings"
        if model in self.asr:
            return "/v1/audio/transcriptions"
        if model in self.videos:
            return "/v1/videos"
        return None

    @property
    def system_fingerprint(self) -> str:
        return f"jacana-{self.version}"
