"""The gateway's settings: every field documented and bounded, read once by ``__main__``.

Environment variables carry the ``JACANA_GATEWAY_`` prefix. Two limits are also read
from the suite-wide names ``JACANA_MAX_PROMPT_CHARS`` and ``JACANA_MAX_NEW_TOKENS``; when
both spellings are set, the gateway-specific one wins. Complex fields are JSON::

    JACANA_GATEWAY_ENGINES='{"smollm2-135m-instruct": ["127.0.0.1:50051", "10.0.0.2:50051"]}'
    JACANA_GATEWAY_EMBEDDINGS='{"all-minilm-l6-v2": ["127.0.0.1:50061"]}'
    JACANA_GATEWAY_ASR='{"whisper-tiny.en": ["127.0.0.1:50081"]}'
    JACANA_GATEWAY_VIDEOS='{"wan2.1-t2v-1.3b": ["127.0.0.1:50091", "10.0.0.3:50091"]}'
    JACANA_GATEWAY_API_KEYS='["sk-local-1", "sk-local-2"]'

A gateway serves generation models (``ENGINES``), embedding models (``EMBEDDINGS``),
speech-to-text models (``ASR``), video models (``VIDEOS``) or any mix; at least one of
the maps must name a model, and a model id belongs to one map.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AliasChoices, Field, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from jacana_common.settings import ServiceSettings

# A model id as clients spell it in "model": no whitespace, no path separators at the ends.
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$")
# host:port, [ipv6]:port or unix:path — what grpc.aio accepts as a target.
_TARGET = re.compile(r"^(unix:.+|\[[0-9A-Fa-f:.]+\]:\d{1,5}|[A-Za-z0-9._-]+:\d{1,5}|dns:.+)$")

EngineTargets = Annotated[list[str], Field(min_length=1, max_length=256)]


def _alias(name: str) -> AliasChoices:
    """Accept the gateway-prefixed variable first, then the suite-wide ``JACANA_`` one."""
    return AliasChoices(f"JACANA_GATEWAY_{name}", f"JACANA_{name}")


class GatewaySettings(ServiceSettings):
    """How the OpenAI-compatible HTTP gateway listens, where engines are and what it allows."""

    model_config = SettingsConfigDict(
        env_prefix="JACANA_GATEWAY_", extra="ignore", frozen=True, validate_by_name=True
    )

    port: int = Field(8000, ge=0, le=65535, description="HTTP port; 0 picks a free one.")
    engines: dict[str, EngineTargets] = Field(
        default_factory=dict,
        max_length=256,
        description=(
            "Served model id -> gRPC endpoints (host:port) of the engine replicas serving it. "
            "Requests are routed to the replica with the fewest in-flight requests. Empty: "
            "no generation models (then another of the model maps must name one)."
        ),
    )
    embeddings: dict[str, EngineTargets] = Field(
        default_factory=dict,
        max_length=256,
        description=(
            "Embedding model id -> gRPC endpoints (host:port) of the embeddings services "
            "serving it on /v1/embeddings; least in-flight first. Empty: none."
        ),
    )
    asr: dict[str, EngineTargets] = Field(
        default_factory=dict,
        max_length=256,
        description=(
            "Speech-to-text model id -> gRPC endpoints (host:port) of the ASR services "
            "serving it on /v1/audio/transcriptions and /v1/audio/translations; least "
            "in-flight first. Empty: none."
        ),
    )
    videos: dict[str, EngineTargets] = Field(
        default_factory=dict,
        max_length=256,
        validate_default=True,  # so that "nothing to serve" is caught when all are unset
        description=(
            "Video model id (as the multimodal services' ListModels names it) -> gRPC "
            "endpoints (host:port) of the services serving it on /v1/videos. A new video "
            "(POST /v1/videos) goes to that model's replicas, least in-flight first. All "
            "multimodal replicas share one Redis job store, so the routes by video id (GET "
            "and DELETE /v1/videos/{id}, its content and remix) and the list (GET "
            "/v1/videos) may go to any replica of any video model. Empty: none."
        ),
    )
    max_prompt_chars: int = Field(
        200_000,
        ge=1,
        le=100_000_000,
        validation_alias=_alias("MAX_PROMPT_CHARS"),
        description=(
            "Longest accepted prompt in characters (chat: all message contents together; "
            "token-id prompts: number of ids). Longer prompts get a 400."
        ),
    )
    max_new_tokens: int = Field(
        4096,
        ge=1,
        le=1_048_576,
        validation_alias=_alias("MAX_NEW_TOKENS"),
        description=(
            "Largest accepted max_tokens; also the cap sent to the engine when a chat "
            "request does not set max_tokens (or sets it to null). Completions default "
            "to 16, null included."
        ),
    )
    request_timeout_s: float = Field(
        600.0,
        gt=0.0,
        le=86_400.0,
        description="Deadline of one generation call to an engine, streaming included.",
    )
    api_keys: list[Annotated[str, Field(min_length=1, max_length=512)]] | None = Field(
        None,
        min_length=1,
        max_length=10_000,
        description=(
            "When set, /v1/* requires 'Authorization: Bearer <one of these>' (else 401). "
            "Unset: no authentication."
        ),
    )
    max_in_flight: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="Generation requests served at once; beyond it new ones get a 429.",
    )
    max_body_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="Largest accepted request body in bytes; larger bodies get a 413.",
    )
    max_audio_body_bytes: int = Field(
        26 * 1024 * 1024,
        ge=1024,
        le=60 * 1024 * 1024,  # the upload travels in one gRPC message (64 MiB at most)
        description=(
            "Largest accepted body of /v1/audio/* requests (the audio file and its form "
            "fields); larger bodies get a 413. Default: OpenAI's 25 MB file limit plus room "
            "for the form."
        ),
    )
    max_video_body_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        le=60 * 1024 * 1024,  # the image travels in one gRPC message (64 MiB at most)
        description=(
            "Largest accepted body of /v1/videos requests (the input_reference image, as "
            "a file part or a base64 data URL, and the other fields); larger bodies get a "
            "413. Default: a 24 MB image as a data URL (base64 adds a third) plus room for "
            "the rest."
        ),
    )
    video_poll_after_ms: int = Field(
        1000,
        ge=100,
        le=60_000,
        description=(
            "Sent as the 'openai-poll-after-ms' header of GET /v1/videos/{id} while the "
            "video is queued or in progress: how long the SDK's poll helper waits before "
            "asking again."
        ),
    )
    health_timeout_s: float = Field(
        2.0, gt=0.0, le=60.0, description="Deadline of each engine health probe behind /health."
    )
    shutdown_grace_s: float = Field(
        30.0,
        ge=0.0,
        le=3600.0,
        description="On SIGTERM, how long in-flight requests (streams included) may finish.",
    )

    @field_validator("engines", "embeddings", "asr", "videos")
    @classmethod
    def _check_engines(cls, engines: dict[str, list[str]]) -> dict[str, list[str]]:
        for model, targets in engines.items():
            if not _MODEL_ID.match(model) or len(model) > 256:
                raise ValueError(f"invalid model id {model!r}")
            for target in targets:
                if not _TARGET.match(target):
                    raise ValueError(f"model {model!r}: endpoint {target!r} is not host:port")
            if len(set(targets)) != len(targets):
                raise ValueError(f"model {model!r}: duplicate endpoints")
        return engines

    @field_validator("videos")
    @classmethod
    def _something_to_serve(
        cls, videos: dict[str, list[str]], info: ValidationInfo
    ) -> dict[str, list[str]]:
        earlier = ("engines", "embeddings", "asr")
        if any(name not in info.data for name in earlier):
            return videos  # one of the other maps is invalid; that error suffices
        maps = {name.upper(): info.data[name] for name in earlier} | {"VIDEOS": videos}
        if not any(maps.values()):
            raise ValueError(
                "no model to serve: set JACANA_GATEWAY_ENGINES (generation models), "
                "JACANA_GATEWAY_EMBEDDINGS (embedding models), JACANA_GATEWAY_ASR "
                "(speech-to-text models), JACANA_GATEWAY_VIDEOS (video models) or several"
            )
        names = list(maps)
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                both = sorted(set(maps[first]) & set(maps[second]))
                if both:
                    raise ValueError(
                        f"model id(s) {both} appear in both JACANA_GATEWAY_{first} and "
                        f"JACANA_GATEWAY_{second}; a model id names one model"
                    )
        return videos
