"""Speculative decoding configuration: one frozen dataclass, part of ``EngineConfig``.

Plain data with no torch import, so ``config.py`` can embed it without cost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpeculativeConfig:
    """How the engine drafts and verifies tokens.

    proposer: a registered proposer name (see :mod:`jacana_engine.spec.registry`), or
        "none" to decode one token per step.
    num_speculative_tokens: most draft tokens per request per step (k); the target scores
        k + 1 positions in one forward pass.
    transport: "inprocess" runs the proposer in the engine thread; "remote" asks the
        drafter service at ``drafter_address`` (see ``spec/remote.py``).
    drafter_address: host:port of the drafter service (remote transport).
    drafter_deadline_s: how long a step waits for the drafter's reply before it decodes
        without drafts.
    drafter_retry_s: after the drafter's stream broke, seconds before reconnecting.
    ngram_min / ngram_max: n-gram lookup tries the last ``ngram_max`` tokens first, then
        shorter ones down to ``ngram_min``.
    suffix_max_depth: longest context + draft path kept in the suffix proposer's tries;
        memory grows up to this many trie nodes per indexed token (less on repetitive text).
    suffix_min_prob: the suffix proposer stops a draft once the estimated probability of
        the whole draft (product of continuation frequencies) falls below this.
    suffix_max_cached_requests: finished requests whose outputs feed the shared suffix trie.
    dynamic_k: adapt each request's k to its running acceptance, down to 0 (no drafting)
        when drafting does not pay, and pause all drafting while measured decode steps
        gain fewer tokens per second with drafts than without (``spec/gate.py``); False
        always drafts up to ``num_speculative_tokens``.
    draft_model: for the "draft_model" proposer, a .gguf file or HF directory of a small
        model with the target's tokenizer.
    draft_num_kv_blocks: blocks of 16 tokens in the draft model's own KV cache.
    draft_device / draft_dtype: where and in what dtype the draft model runs.
    """

    proposer: str = "none"
    num_speculative_tokens: int = 8
    transport: str = "inprocess"
    drafter_address: str = "127.0.0.1:50071"
    drafter_deadline_s: float = 0.05
    drafter_retry_s: float = 1.0
    ngram_min: int = 1
    ngram_max: int = 4
    suffix_max_depth: int = 16
    suffix_min_prob: float = 0.1
    suffix_max_cached_requests: int = 256
    dynamic_k: bool = True
    draft_model: str = ""
    draft_num_kv_blocks: int = 256
    draft_device: str = "cpu"
    draft_dtype: str = "float32"

    @property
    def enabled(self) -> bool:
        return self.proposer != "none" and self.num_speculative_tokens > 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first inconsistent field."""
        if self.num_speculative_tokens < 0:
            raise ValueError("num_speculative_tokens must be >= 0")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        if self.suffix_max_depth < 2:
            raise ValueError("suffix_max_depth must be >= 2")
        if not 0.0 <= self.suffix_min_prob <= 1.0:
            raise ValueError("suffix_min_prob must be in [0, 1]")
        if not (self.drafter_deadline_s > 0 and self.drafter_retry_s >= 0):
            raise ValueError("drafter_deadline_s must be > 0 and drafter_retry_s >= 0")
        if self.suffix_max_cached_requests < 0:
            raise ValueError("suffix_max_cached_requests must be >= 0")
