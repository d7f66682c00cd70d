"""What one gateway app instance owns, reachable from handlers as ``app.state.gateway``."""

from __future__ import annotations

from dataclasses import dataclass, field

from jacana_gateway.admission import Admission
from jacana_gateway.config import GatewaySettings
from jacana_gateway.embeddings_route import EmbeddingsBackends
from jacana_gateway.replica_pool import ReplicaPool


@dataclass
class GatewayState:
    """Per-app state: settings, the engine pool, the embeddings services, admission
    control, static facts. A model id is in at most one of ``pool`` and ``embeddings``."""

    settings: GatewaySettings
    pool: ReplicaPool
    admission: Admission
    version: str
    started_at: int
    embeddings: EmbeddingsBackends = field(default_factory=lambda: EmbeddingsBackends({}))

    @property
    def models(self) -> list[str]:
        """Every served model id: generation models first, then embedding models."""
        return [*self.pool.models, *self.embeddings.models]

    @property
    def system_fingerprint(self) -> str:
        return f"jacana-{self.version}"
