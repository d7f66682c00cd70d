"""What one gateway app instance owns, reachable from handlers as ``app.state.gateway``."""

from __future__ import annotations

from dataclasses import dataclass

from jacana_gateway.admission import Admission
from jacana_gateway.config import GatewaySettings
from jacana_gateway.engine_pool import EnginePool


@dataclass
class GatewayState:
    """Per-app state: settings, the engine pool, admission control, static facts."""

    settings: GatewaySettings
    pool: EnginePool
    admission: Admission
    version: str
    started_at: int

    @property
    def system_fingerprint(self) -> str:
        return f"jacana-{self.version}"
