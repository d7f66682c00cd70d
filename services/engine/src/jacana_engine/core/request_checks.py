"""Checks of an incoming request against the model's limits.

Each raises :class:`InvalidRequestError` naming the offending parameter, with a message
a client can act on (the OpenAI API's wording where it has one).
"""

from __future__ import annotations

from collections.abc import Sequence

from jacana_engine.core.errors import InvalidRequestError

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for a request past the window


def check_token_ids(
    token_ids: Sequence[int], vocab_size: int, *, param: str, empty: str, noun: str
) -> None:
    """Non-empty, every id in ``[0, vocab_size)``; ``empty`` and ``noun`` word the errors
    (e.g. "the prompt is empty", "prompt token ids")."""
    if not token_ids:
        raise InvalidRequestError(empty, param)
    if any(not (0 <= t < vocab_size) for t in token_ids):
        raise InvalidRequestError(f"{noun} must be in [0, {vocab_size})", param)


def resolve_max_tokens(
    n_prompt: int, max_tokens: int | None, max_model_len: int, request_limit: int
) -> int:
    """The request's output limit, or the reason it can never run.

    ``request_limit``: most prompt + output tokens one request may have (the context
    window, or the KV pool when smaller: the pool must hold the whole request at once,
    preemption cannot help there).
    """
    what = (
        f"maximum context length is {max_model_len} tokens"
        if request_limit == max_model_len
        else f"KV cache holds at most {request_limit} tokens per request"
    )
    if n_prompt >= request_limit:
        raise InvalidRequestError(
            f"This model's {what}, and the prompt has {n_prompt}: no room is left for "
            "the completion. Shorten the prompt.",
            "prompt",
            CONTEXT_LENGTH_EXCEEDED,
        )
    if max_tokens is None:
        return request_limit - n_prompt
    if n_prompt + max_tokens > request_limit:
        raise InvalidRequestError(
            f"This model's {what}. However, you requested {n_prompt + max_tokens} tokens "
            f"({n_prompt} in the prompt, {max_tokens} for the completion). Reduce the "
            "prompt or max_tokens.",
            "max_tokens",
            CONTEXT_LENGTH_EXCEEDED,
        )
    return max_tokens
