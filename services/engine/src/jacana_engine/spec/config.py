"""Speculative decoding configuration: each field declared and documented once.

:class:`SpeculativeConfig` is what the proposers and the verifier read; the engine nests
it (``EngineConfig.speculative``) and the drafter builds one per stream. The services read
its fields from their environment under their own names (the engine's
``JACANA_ENGINE_SPECULATIVE_NGRAM_MIN``, the drafter's ``JACANA_DRAFTER_NGRAM_MIN``):
:meth:`SpeculativeSettings.named` declares a settings class whose fields are these same
fields renamed, so a description, type, default or bound is written here and nowhere else.

Plain data with no torch import, so ``config.py`` can embed it without cost.
"""

from __future__ import annotations

import copy
from typing import ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator


class SpeculativeConfig(BaseModel):
    """How the engine drafts and verifies tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    proposer: str = Field(
        "none",
        description="Draft source for speculative decoding: none (off), ngram (prompt "
        "lookup), suffix (suffix decoding over the request and recent outputs) or "
        "draft_model (a small LM); a name registered in jacana_engine.spec.registry.",
    )
    num_speculative_tokens: int = Field(
        8,
        ge=1,
        le=16,
        description="Most draft tokens verified per request per step (k); the target "
        "scores k + 1 positions in one forward pass.",
    )
    transport: Literal["inprocess", "remote"] = Field(
        "inprocess",
        description="Where the proposer runs: inprocess (the engine thread) or remote (the "
        "drafter service at drafter_address, spec/remote.py).",
    )
    drafter_address: str = Field(
        "127.0.0.1:50071",
        pattern=r"^[^\s:]+:\d{1,5}$",
        description="host:port of the drafter service (remote transport).",
    )
    drafter_deadline_ms: int = Field(
        50,
        ge=1,
        le=10_000,
        description="Milliseconds a step waits for the drafter; later, it decodes without "
        "drafts (and so it does while the drafter is down).",
    )
    drafter_retry_s: float = Field(
        1.0,
        ge=0.0,
        le=3600.0,
        description="After the drafter's stream broke, seconds before reconnecting.",
    )
    ngram_min: int = Field(1, ge=1, le=16, description="Shortest tail the n-gram proposer matches.")
    ngram_max: int = Field(
        4, ge=1, le=16, description="Longest tail the n-gram proposer matches (tried first)."
    )
    suffix_max_depth: int = Field(
        16,
        ge=2,
        le=256,
        description="Longest context + draft path kept in the suffix proposer's tries; memory "
        "grows up to this many trie nodes per indexed token (less on repetitive text).",
    )
    suffix_min_prob: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="The suffix proposer stops a draft once its estimated probability (the "
        "product of continuation frequencies) falls below this.",
    )
    suffix_max_cached_requests: int = Field(
        256,
        ge=0,
        le=100_000,
        description="Finished requests whose outputs feed the shared suffix trie (in the "
        "drafter: per stream).",
    )
    dynamic_k: bool = Field(
        True,
        description="Adapt each request's draft length to its acceptance rate, down to no "
        "drafting when it does not pay, and pause all drafting while measured decode steps "
        "gain fewer tokens per second with drafts than without (spec/gate.py); false always "
        "drafts up to num_speculative_tokens.",
    )
    draft_model: str = Field(
        "",
        description="For the draft_model proposer: a .gguf file or HF directory of a small "
        "model with the target's tokenizer (in the drafter, each stream loads its own copy).",
    )
    draft_num_kv_blocks: int = Field(
        256, ge=1, le=1 << 20, description="16-token blocks in the draft model's KV cache."
    )
    draft_device: str = Field(
        "cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="Torch device of the draft model."
    )
    draft_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Compute dtype of the draft model."
    )

    @model_validator(mode="after")
    def _ngram_range(self) -> Self:
        if self.ngram_min > self.ngram_max:
            raise ValueError("ngram_min must not exceed ngram_max")
        return self

    @property
    def enabled(self) -> bool:
        return self.proposer != "none"

    @property
    def drafter_deadline_s(self) -> float:
        return self.drafter_deadline_ms / 1000


class SpeculativeSettings(BaseModel):
    """Base of a service's speculative settings (see :meth:`named`)."""

    config_names: ClassVar[dict[str, str]] = {}  # setting name -> SpeculativeConfig field

    @classmethod
    def named(cls, name: str, doc: str, names: dict[str, str]) -> type[SpeculativeSettings]:
        """A settings mixin declaring ``SpeculativeConfig``'s field ``names[setting]`` as
        ``setting`` (same type, default, bounds and description)."""
        fields = SpeculativeConfig.model_fields
        declared = {
            setting: (fields[field].annotation, copy.copy(fields[field]))
            for setting, field in names.items()
        }
        mixin = create_model(name, __base__=cls, __doc__=doc, __module__=cls.__module__, **declared)
        mixin.config_names = dict(names)
        return mixin

    def build_speculative_config(self, **fields: object) -> SpeculativeConfig:
        """The ``SpeculativeConfig`` these settings describe; ``fields`` add the others."""
        named = {field: getattr(self, setting) for setting, field in self.config_names.items()}
        return SpeculativeConfig(**named, **fields)
