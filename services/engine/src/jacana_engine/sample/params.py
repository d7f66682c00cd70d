"""Per-request sampling and stopping parameters, validated at the engine's door."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property

from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.sample.structured_output import Guide

MAX_LOGPROBS = 20  # most alternatives per position (OpenAI's top_logprobs bound)
MAX_LOGIT_BIAS = 100.0  # |bias| bound, as OpenAI's
MAX_PENALTY = 2.0  # |presence_penalty|, |frequency_penalty| bound, as OpenAI's

# Fields that never edit the logits before the draw: the draw's own parameters, the
# stopping rules and what is reported. Every other field (and any added later) does.
_DRAW_STOP_REPORT = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "max_tokens",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "logprobs",
        "prompt_logprobs",
    }
)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens, what to report about them, and when to stop.

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
    presence_penalty: OpenAI semantics, in [-2, 2]: subtracted once from the logit of every
        token that already occurs in the output.
    frequency_penalty: OpenAI semantics, in [-2, 2]: subtracted from a token's logit once per
        occurrence in the output.
    repetition_penalty: Hugging Face semantics, > 0 (1 disables): the logit of every token of
        the prompt or the output is divided by it when positive, multiplied when negative.
    logit_bias: ``(token id, bias)`` pairs, bias in [-100, 100], added to the logits; a
        mapping is accepted and stored sorted by token id.
    min_tokens: until this many tokens are out, EOS (unless ``ignore_eos``) and
        ``stop_token_ids`` cannot be sampled. Stop strings are not held back by it.
    logprobs: None returns no logprobs; k in [0, 20] returns each output token's logprob
        and the k most likely alternatives.
    prompt_logprobs: the same for the prompt's tokens (the first one has none).
    guide: what the output must match (a JSON schema, a regex, ...:
        :mod:`jacana_engine.sample.structured_output`); every token it rejects is masked to -inf
        after the other edits. Not with ``min_tokens`` or ``ignore_eos``, which would
        hold the output open past the grammar's end.

    Logprobs are those of the model's raw distribution, ``log_softmax(logits)``, before
    bias, penalties, the guide's mask, temperature and top-k/top-p/min-p. Processing order:
    bias, repetition penalty, frequency/presence penalties, the min_tokens mask, the
    guide's mask (HF and vLLM apply bias before penalties too).
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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    guide: Guide | None = None

    def __post_init__(self) -> None:
        if isinstance(self.logit_bias, Mapping):
            pairs = tuple(sorted((int(t), float(b)) for t, b in self.logit_bias.items()))
            object.__setattr__(self, "logit_bias", pairs)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @cached_property
    def edits_logits(self) -> bool:
        """Whether a logits processor edits this request's logits before the draw: some
        field outside the draw's parameters, the stopping rules and the logprobs (bias,
        penalties, min_tokens, or any field added later) differs from its default.
        Computed once a request (read for every row of every step); the parameters are
        frozen."""
        return any(
            getattr(self, f.name) != _DEFAULTS[f.name]
            for f in fields(self)
            if f.name not in _DRAW_STOP_REPORT
        )

    @property
    def reads_logprobs(self) -> bool:
        """Whether the request reports logprobs of its output or of its prompt."""
        return self.logprobs is not None or self.prompt_logprobs is not None

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
        self._validate_processing(vocab_size)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (0 <= value <= MAX_LOGPROBS):
                raise InvalidRequestError(f"{name} must be in [0, {MAX_LOGPROBS}]", name)

    def _validate_processing(self, vocab_size: int) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (-MAX_PENALTY <= value <= MAX_PENALTY):  # NaN fails too
                raise InvalidRequestError(f"{name} must be in [-2, 2]", name)
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise InvalidRequestError(
                "repetition_penalty must be a finite number > 0", "repetition_penalty"
            )
        out_of_vocab = [t for t, _ in self.logit_bias if not (0 <= t < vocab_size)]
        if out_of_vocab:
            raise InvalidRequestError(
                f"logit_bias token ids must be in [0, {vocab_size}): {out_of_vocab[:8]}",
                "logit_bias",
            )
        if any(not (-MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS) for _, b in self.logit_bias):
            raise InvalidRequestError("logit_bias values must be in [-100, 100]", "logit_bias")
        if len({t for t, _ in self.logit_bias}) != len(self.logit_bias):
            raise InvalidRequestError("logit_bias names a token id twice", "logit_bias")
        if self.min_tokens < 0:
            raise InvalidRequestError("min_tokens must be >= 0", "min_tokens")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
                "min_tokens",
            )
        if self.guide is not None:
            self.guide.validate()
            for name in ("min_tokens", "ignore_eos"):
                if getattr(self, name):
                    raise InvalidRequestError(
                        f"{name} cannot be combined with {self.guide.param}: the output "
                        "must end where the grammar does",
                        name,
                    )


# Each field's default, for ``edits_logits`` (a plain dict: built once, read per row).
_DEFAULTS = {f.name: getattr(SamplingParams(), f.name) for f in fields(SamplingParams)}
