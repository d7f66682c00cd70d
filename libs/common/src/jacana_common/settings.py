"""Settings base shared by every service.

Each service subclasses :class:`ServiceSettings` with its own env prefix
(``JACANA_ENGINE_``, ``JACANA_GATEWAY_``…). Every field carries a description and bounds;
:meth:`ServiceSettings.load` turns a validation failure into one readable start-up error
instead of a traceback.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict


class SettingsError(SystemExit):
    """Invalid configuration at start-up; the message names every offending variable."""


class ServiceSettings(BaseSettings):
    """Fields every gRPC/HTTP service has. Subclasses set ``model_config['env_prefix']``."""

    model_config = SettingsConfigDict(env_prefix="JACANA_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(0, ge=0, le=65535, description="Port to listen on; 0 picks a free one.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Minimum level of log records written to stderr."
    )
    log_json: bool = Field(False, description="Write logs as one JSON object per line.")
    shutdown_grace_s: float = Field(
        10.0, ge=0.0, le=600.0, description="On SIGTERM, how long in-flight work may finish."
    )

    @classmethod
    def load(cls, **overrides: object) -> Self:
        """Read the environment (and ``overrides``); exit with a clear message if invalid."""
        try:
            return cls(**overrides)
        except ValidationError as exc:
            prefix = cls.model_config.get("env_prefix", "")
            lines = [f"invalid {cls.__name__} configuration:"]
            for err in exc.errors():
                name = ".".join(str(p) for p in err["loc"]) or "?"
                lines.append(f"  {prefix}{name.upper()}: {err['msg']} (got {err.get('input')!r})")
            raise SettingsError("\n".join(lines)) from None
