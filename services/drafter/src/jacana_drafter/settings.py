"""Environment settings of the drafter service (prefix ``JACANA_DRAFTER_``).

Read once in ``__main__``. Which proposer runs is the engine's choice (the first message
of each stream names it); these settings tune the proposers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from jacana_common.settings import ServiceSettings
from jacana_engine.spec.config import SpeculativeConfig


class DrafterSettings(ServiceSettings):
    """Every knob of the drafter service, validated at start-up."""

    model_config = SettingsConfigDict(env_prefix="JACANA_DRAFTER_", extra="ignore", frozen=True)

    port: int = Field(50071, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    ngram_min: int = Field(1, ge=1, le=16, description="Shortest tail the n-gram proposer matches.")
    ngram_max: int = Field(
        4, ge=1, le=16, description="Longest tail the n-gram proposer matches (tried first)."
    )
    suffix_max_depth: int = Field(
        16, ge=2, le=256, description="Longest context + draft path kept in the suffix tries."
    )
    suffix_min_prob: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="The suffix proposer stops a draft when its estimated probability "
        "falls below this.",
    )
    suffix_max_cached_requests: int = Field(
        256,
        ge=0,
        le=100_000,
        description="Finished requests per stream whose outputs feed the shared suffix trie.",
    )
    max_streams: int = Field(
        64, ge=1, le=4096, description="Most concurrent engine streams; more are refused."
    )

    draft_model: str = Field(
        "",
        description="For streams that ask for draft_model: a .gguf file or HF directory of a "
        "small model with the engines' tokenizer (each stream loads its own copy).",
    )
    draft_num_kv_blocks: int = Field(
        256, ge=1, le=1 << 20, description="16-token blocks in each stream's draft KV cache."
    )
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="Draft model device.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Draft model compute dtype."
    )

    @model_validator(mode="after")
    def _ngram_range(self) -> DrafterSettings:
        if self.ngram_min > self.ngram_max:
            raise ValueError("JACANA_DRAFTER_NGRAM_MIN must not exceed JACANA_DRAFTER_NGRAM_MAX")
        return self

    def speculative_config(self, proposer: str) -> SpeculativeConfig:
        """The proposer configuration of one stream."""
        return SpeculativeConfig(
            proposer=proposer,
            ngram_min=self.ngram_min,
            ngram_max=self.ngram_max,
            suffix_max_depth=self.suffix_max_depth,
            suffix_min_prob=self.suffix_min_prob,
            suffix_max_cached_requests=self.suffix_max_cached_requests,
            draft_model=self.draft_model,
            draft_num_kv_blocks=self.draft_num_kv_blocks,
            draft_device=self.device,
            draft_dtype=self.dtype,
        )
