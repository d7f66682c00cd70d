"""Settings base shared by every service.

Each service subclasses :class:`ServiceSettings` with its own env prefix
(``JACANA_ENGINE_``, ``JACANA_GATEWAY_``…). Every field carries a description and bounds;
:meth:`ServiceSettings.load` turns a validation failure into one readable start-up error
instead of a traceback.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import AliasChoices, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError


def _alias_names(field: FieldInfo) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, str):
        return [alias.upper()]
    if isinstance(alias, AliasChoices):
        return [str(c).upper() for c in alias.choices]
    return []


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
    gil_switch_interval_us: int = Field(
        200,
        ge=0,
        le=100_000,
        description="Longest a thread running Python keeps the GIL while another waits "
        "(microseconds; 0 keeps Python's 5000): short turns keep a model thread's kernel "
        "launches from queueing behind the event loop.",
    )

    @classmethod
    def env_names(cls, field_name: str) -> list[str]:
        """The environment variables that set ``field_name``, in order of precedence."""
        field = cls.model_fields.get(field_name)
        if field is None:  # errors name aliased fields by the alias that was read
            field = next(
                (
                    f
                    for f in cls.model_fields.values()
                    if _alias_names(f) and field_name.upper() in _alias_names(f)
                ),
                None,
            )
        if field is not None and _alias_names(field):
            return _alias_names(field)
        return [f"{cls.model_config.get('env_prefix', '')}{field_name}".upper()]

    @classmethod
    def load(cls, **overrides: object) -> Self:
        """Read the environment (and ``overrides``); exit with a clear message if invalid."""
        try:
            return cls(**overrides)
        except ValidationError as exc:
            lines = [f"invalid {cls.__name__} configuration:"]
            for err in exc.errors():
                loc = [str(p) for p in err["loc"]]
                names = " or ".join(cls.env_names(loc[0])) if loc else "?"
                where = f"{names}[{'.'.join(loc[1:])}]" if len(loc) > 1 else names
                lines.append(f"  {where}: {err['msg']} (got {err.get('input')!r})")
            raise SettingsError("\n".join(lines)) from None
        except SourceError as exc:  # a structured variable (list, dict) that is not JSON
            raise SettingsError(
                f"invalid {cls.__name__} configuration: {exc} (list and mapping values are JSON)"
            ) from None
