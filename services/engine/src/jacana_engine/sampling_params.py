"""Per-request sampling and stopping parameters, validated at the engine's door."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from jacana_engine.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop.

    temperature: 0 selects greedy (argmax); > 0 samples from softmax(logits / temperature).
    top_p: nucleus mass in (0, 1]; 1 disables.
    top_k: keep the k most likely tokens; 0 disables.
    min_p: drop tokens with p < min_p * p_max; 0 disables.
    seed: per-request RNG seed; the same seed gives the same tokens whatever else is batched.
        None draws a seed from the engine's own generator.
    max_tokens: maximum new tokens; None means up to the context length.
    stop: stop strings; the output text ends before the earliest match.
    stop_token_ids: extra token ids that end generation (not included in the text).
    ignore_eos: keep going past the model's EOS tokens.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int) -> None:
        """Raise :class:`InvalidRequestError` naming the first bad field."""
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError("temperature must be a finite number >= 0", "temperature")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError("top_p must be in (0, 1]", "top_p")
        if self.top_k < 0:
            raise InvalidRequestError("top_k must be >= 0", "top_k")
        if not (0.0 <= self.min_p <= 1.0):
            raise InvalidRequestError("min_p must be in [0, 1]", "min_p")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be >= 1", "max_tokens")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty", "stop")
        bad = [t for t in self.stop_token_ids if not (0 <= t < vocab_size)]
        if bad:
            raise InvalidRequestError(f"stop_token_ids out of vocabulary: {bad}", "stop_token_ids")
