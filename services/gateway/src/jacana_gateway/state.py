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
from jacana_gateway.middleware.admission import Admission
from jacana_gateway.settings import GatewaySettings


@dataclass
class GatewayState:
    """Per-app state: settings, the engine pool, the embeddings and ASR services, admission
    control, static facts. A model id is in at most one of ``pool``, ``embeddings`` and
    ``asr``."""

    settings: GatewaySettings
    pool: ReplicaPool
    admission: Admission
    version: str
    started_at: int
    embeddings: EmbeddingsBackends = field(default_factory=lambda: EmbeddingsBackends({}))
    asr: AsrBackends = field(default_factory=lambda: AsrBackends({}))

    async def start(self) -> None:
        """Open the channels of every backend (connections are lazy: a service that is
        down does not fail start-up)."""
        await asyncio.gather(self.pool.start(), self.embeddings.start(), self.asr.start())

    async def close(self) -> None:
        """Close every backend's channels; calls still open on them end with CANCELLED."""
        await asyncio.gather(self.pool.close(), self.embeddings.close(), self.asr.close())

    @property
    def models(self) -> list[str]:
        """Every served model id: generation models first, then embedding models, then
        speech-to-text models."""
        return [*self.pool.models, *self.embeddings.models, *self.asr.models]

    def route_for(self, model: str) -> str | None:
        """The route that serves ``model`` (one of each kind's), or None when none does."""
        if model in self.pool:
            return "/v1/chat/completions"
        if model in self.embeddings:
            return "/v1/embeddings"
        if model in self.asr:
            return "/v1/audio/transcriptions"
        return None

    @property
    def system_fingerprint(self) -> str:
        return f"jacana-{self.version}"
