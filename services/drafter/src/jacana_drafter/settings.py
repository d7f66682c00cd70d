"""Environment settings of the drafter service (prefix ``JACANA_DRAFTER_``).

Read once in ``__main__``. Which proposer runs is the engine's choice (the first message
of each stream names it); these settings tune the proposers. The proposer fields are
:class:`~jacana_engine.spec.config.SpeculativeConfig`'s own (declared and documented
there once), under the drafter's names.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from jacana_common.metrics import MetricsSettings
from jacana_common.settings import ServiceSettings
from jacana_engine.spec.config import SpeculativeConfig, SpeculativeSettings

ProposerEnv = SpeculativeSettings.named(
    "ProposerEnv",
    "Proposers: how the n-gram, suffix and draft-model proposers draft.",
    {
        "ngram_min": "ngram_min",
        "ngram_max": "ngram_max",
        "suffix_max_depth": "suffix_max_depth",
        "suffix_min_prob": "suffix_min_prob",
        "suffix_max_cached_requests": "suffix_max_cached_requests",
        "draft_model": "draft_model",
        "draft_num_kv_blocks": "draft_num_kv_blocks",
        "device": "draft_device",
        "dtype": "draft_dtype",
    },
)


class DrafterSettings(ServiceSettings, MetricsSettings, ProposerEnv):
    """Every knob of the drafter service, validated at start-up."""

    model_config = SettingsConfigDict(env_prefix="JACANA_DRAFTER_", extra="ignore", frozen=True)

    port: int = Field(50071, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    max_streams: int = Field(
        64, ge=1, le=4096, description="Most concurrent engine streams; more are refused."
    )

    @model_validator(mode="after")
    def _ngram_range(self) -> DrafterSettings:
        if self.ngram_min > self.ngram_max:
            raise ValueError("JACANA_DRAFTER_NGRAM_MIN must not exceed JACANA_DRAFTER_NGRAM_MAX")
        return self

    def speculative_config(self, proposer: str) -> SpeculativeConfig:
        """The proposer configuration of one stream."""
        return self.build_speculative_config(proposer=proposer)
