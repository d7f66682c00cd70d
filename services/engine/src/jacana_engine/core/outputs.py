"""What the engine core hands back after each step, per request."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # aborted by the caller


@dataclass(frozen=True)
class TokenLogprob:
    """One position's logprobs under the model's raw distribution (``log_softmax(logits)``).

    token_id: the token at this position (sampled, or the prompt's own).
    logprob: its log-probability; None only for a prompt's first token (nothing predicts it).
    top: the most likely tokens at this position as ``(token id, logprob)``, most likely
        first; as many as the request asked for (ties in any order).
    """

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RequestOutput:
    """The delta of one request produced by one engine step.

    new_token_ids: tokens sampled this step (after stop handling: a stop token is excluded).
    new_text: text released this step: complete UTF-8 characters only, never a prefix of a
        stop string that may still match.
    finished: True on the request's last output; ``finish_reason`` is set then.
    num_prompt_tokens / num_output_tokens: running usage counts.
    num_cached_tokens: prompt tokens served from the prefix cache.
    matched_stop: the stop string or token id that ended generation, if any.
    logprobs: with ``SamplingParams.logprobs`` set, one entry per ``new_token_ids`` item;
        otherwise None.
    prompt_logprobs: with ``SamplingParams.prompt_logprobs`` set, one entry per prompt token,
        on the request's first output only; otherwise None.
    """

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    matched_stop: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


def merge_outputs(deltas: Sequence[RequestOutput]) -> RequestOutput:
    """One request's consecutive deltas as a single delta (tokens, text and logprobs
    concatenated; counts, finish and stop from the last, prompt logprobs from the first)."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    return dataclasses.replace(
        last,
        new_token_ids=[t for d in deltas for t in d.new_token_ids],
        new_text="".join(d.new_text for d in deltas),
        logprobs=None
        if last.logprobs is None
        else [lp for d in deltas for lp in (d.logprobs or [])],
        prompt_logprobs=deltas[0].prompt_logprobs,
    )
