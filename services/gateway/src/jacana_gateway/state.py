"""What one gateway app instance owns, reachable from handlers as ``app.state.gateway``."""

from __future__ import annotations

from dataclasses import dataclass, field

from jacana_gateway.admission import Admission
from jacana_gateway.audio_route import AsrBackends
from jacana_gateway.config import GatewaySettings
from jacana_gateway.embeddings_route import EmbeddingsBackends
from jacana_gateway.replica_pool import ReplicaPool


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
