"""What the engine core hands back after each step, per request."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # aborted by the caller


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
