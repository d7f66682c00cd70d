"""The OpenAI sampling surface beyond temperature/top-p: penalties, ``logit_bias``,
``min_tokens``, ``n`` / ``best_of``, logprobs and ``echo``. Pure functions, no I/O.

Requests: :func:`apply` fills these fields of the engine's ``SamplingParams`` after
:func:`check` has refused combinations that make no sense (400, ``invalid_value``, the
field named in ``param``):
- chat ``top_logprobs`` without ``logprobs: true`` (as OpenAI);
- ``min_tokens`` above ``max_tokens`` / ``max_completion_tokens``;
- completions ``best_of`` below ``n``, or above ``n`` with ``stream`` (the best choices
  are only known at the end, as OpenAI).

Mapping: chat ``logprobs: true`` with ``top_logprobs`` k asks the engine for the chosen
token's logprob plus k alternatives; completions ``logprobs`` k does the same, and with
``echo`` also for the prompt. ``best_of`` > ``n`` runs ``best_of`` choices with logprobs
(for ranking; they are dropped from the answer unless asked for). Logit-bias keys are
token id strings; the engine checks them against its vocabulary.

Responses: :func:`response_format` says how the answer is shaped, :func:`kept_choices`
how many of the engine's choices are answered.
"""

from __future__ import annotations

from jacana_common.errors import invalid_value
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_gateway.schemas.chat import ChatCompletionRequest
from jacana_gateway.schemas.generation import CompletionRequest, GenerationRequest
from jacana_gateway.translate import tool_calling
from jacana_gateway.translate.generation_response import ChatFormat, Format, TextFormat


def _best_of(body: GenerationRequest) -> int | None:
    return body.best_of if isinstance(body, CompletionRequest) else None


def check(body: GenerationRequest, max_tokens: int | None) -> None:
    """Raise a 400 for combinations of fields the request cannot have together.

    ``max_tokens``: the client's own limit (either name), None when unset."""
    if isinstance(body, ChatCompletionRequest) and body.top_logprobs and not body.logprobs:
        raise invalid_value("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
    if body.min_tokens and max_tokens is not None and body.min_tokens > max_tokens:
        raise invalid_value(
            f"'min_tokens' ({body.min_tokens}) must not exceed the maximum number of new "
            f"tokens ({max_tokens}).",
            "min_tokens",
        )
    best_of, n = _best_of(body), body.n or 1
    if best_of is not None and best_of < n:
        raise invalid_value(f"'best_of' ({best_of}) must be at least 'n' ({n}).", "best_of")
    if best_of is not None and best_of > n and body.stream:
        raise invalid_value("'best_of' greater than 'n' cannot be streamed.", "best_of")


def apply(params: pb.SamplingParams, body: GenerationRequest) -> None:
    """Fill ``params`` with ``body``'s penalties, bias, min_tokens, choices and logprobs."""
    params.presence_penalty = body.presence_penalty or 0.0
    params.frequency_penalty = body.frequency_penalty or 0.0
    params.repetition_penalty = body.repetition_penalty or 1.0
    for token, bias in (body.logit_bias or {}).items():
        params.logit_bias[int(token)] = bias
    params.min_tokens = body.min_tokens or 0
    n = body.n or 1
    best_of = _best_of(body)
    params.n = max(n, best_of or 1)
    if isinstance(body, ChatCompletionRequest):
        if body.logprobs:
            params.logprobs = body.top_logprobs or 0
        return
    if body.logprobs is not None:
        params.logprobs = body.logprobs
        if body.echo:
            params.prompt_logprobs = body.logprobs
    elif best_of is not None and best_of > n:
        params.logprobs = 0  # ranking needs each token's logprob
    params.echo = bool(body.echo)


def kept_choices(body: GenerationRequest) -> int | None:
    """How many choices to answer when fewer than the engine runs (``best_of``), else None."""
    best_of, n = _best_of(body), body.n or 1
    return n if best_of is not None and best_of > n else None


def response_format(body: GenerationRequest) -> Format:
    """The response shape this request asked for."""
    if isinstance(body, ChatCompletionRequest):
        return ChatFormat(
            top_logprobs=(body.top_logprobs or 0) if body.logprobs else None,
            tools=tool_calling.offered(body),
        )
    prompt = body.prompt if isinstance(body.prompt, str) else None
    return TextFormat(logprobs=body.logprobs, echo=bool(body.echo), prompt=prompt)
