"""From a validated OpenAI request to the engine's ``GenerateRequest``, limits included.

Pure functions: no I/O. The gateway's own limits are enforced here (400s):
- prompt longer than ``max_prompt_chars`` (chat: all contents together; token-id prompts:
  number of ids), code ``"prompt_too_long"``;
- ``max_tokens`` / ``max_completion_tokens`` above ``max_new_tokens``. When a chat
  request leaves both unset or null, the engine gets ``max_new_tokens`` with
  ``clamp_max_tokens`` set, so it is lowered to fit the context rather than rejected.
  Completions, unset or null, get OpenAI's 16 (or ``max_new_tokens`` when lower). No
  request reaches the engine without a bound.
Sampling defaults follow OpenAI: temperature 1, top_p 1; ``top_k`` -1 becomes 0 (off);
negative seeds are taken modulo 2^64 (the engine's seed is unsigned). Penalties, bias,
choices, logprobs and echo: :mod:`.sampling`; response_format and the guided_* fields:
:mod:`.structured_output`.
"""

from __future__ import annotations

from jacana_common.errors import ApiError
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_gateway.schemas.chat import ChatCompletionRequest
from jacana_gateway.schemas.generation import (
    COMPLETION_MAX_TOKENS,
    CompletionRequest,
    GenerationRequest,
)
from jacana_gateway.translate import sampling, structured_output, tool_calling

_ENGINE_ROLE = {"developer": "system"}


def _max_tokens(body: GenerationRequest, max_new_tokens: int) -> int | None:
    """The client's new-token limit (checked against ``max_new_tokens``); None for a chat
    request that sets neither name (the engine then gets the server's cap, clamped)."""
    param, value = "max_tokens", body.max_tokens
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        if value is not None and value != body.max_completion_tokens:
            raise ApiError(
                400,
                "Set only one of 'max_tokens' and 'max_completion_tokens' (they differ).",
                "max_completion_tokens",
                "invalid_value",
            )
        param, value = "max_completion_tokens", body.max_completion_tokens
    if value is None:
        if isinstance(body, CompletionRequest):
            return min(COMPLETION_MAX_TOKENS, max_new_tokens)
        return None
    if value > max_new_tokens:
        raise ApiError(
            400,
            f"'{param}' is {value}, above this server's limit of {max_new_tokens} new tokens.",
            param,
            "invalid_value",
        )
    return value


def _check_prompt_size(body: ChatCompletionRequest | CompletionRequest, limit: int) -> None:
    size = body.prompt_chars()
    if size > limit:
        param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        unit = "token ids" if isinstance(getattr(body, "prompt", ""), list) else "characters"
        raise ApiError(
            400,
            f"The prompt is {size} {unit} long; this server accepts at most {limit}.",
            param,
            "prompt_too_long",
        )


def sampling_params(body: GenerationRequest, max_new_tokens: int) -> pb.SamplingParams:
    """The engine's sampling parameters for ``body`` (raises 400 on limit violations)."""
    max_tokens = _max_tokens(body, max_new_tokens)
    sampling.check(body, max_tokens)
    params = pb.SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(body.top_k or 0, 0),
        min_p=body.min_p or 0.0,
        max_tokens=max_new_tokens if max_tokens is None else max_tokens,
        clamp_max_tokens=max_tokens is None,
        stop=body.stop,
        stop_token_ids=body.stop_token_ids or [],
        ignore_eos=body.ignore_eos,
    )
    if body.seed is not None:
        params.seed = body.seed % 2**64
    sampling.apply(params, body)
    guide = structured_output.guide(body)
    if guide is not None:
        params.guide.CopyFrom(guide)
    return params


def _scheduling(body: GenerationRequest) -> dict[str, int | str | bool]:
    """The engine's scheduling fields: ``priority``, ``cache_salt`` and
    ``disable_speculation`` (unset: 0, "" and False)."""
    return {
        "priority": body.priority or 0,
        "cache_salt": body.cache_salt or "",
        "disable_speculation": body.disable_speculation,
    }


def chat_request(
    body: ChatCompletionRequest, request_id: str, *, max_prompt_chars: int, max_new_tokens: int
) -> pb.GenerateRequest:
    """The engine request for a chat completion; the engine applies the chat template."""
    _check_prompt_size(body, max_prompt_chars)
    messages = [
        pb.ChatMessage(
            role=_ENGINE_ROLE.get(m.role, m.role),
            content=m.content or "",
            name=m.name or "",
            tool_calls=tool_calling.message_calls(m.tool_calls or []),
            tool_call_id=m.tool_call_id or "",
        )
        for m in body.messages
    ]
    chat = pb.ChatInput(
        messages=messages,
        add_generation_prompt=body.add_generation_prompt,
        tools=tool_calling.tools_json(body),
    )
    return pb.GenerateRequest(
        request_id=request_id,
        chat=chat,
        sampling=sampling_params(body, max_new_tokens),
        **_scheduling(body),
    )


def completion_request(
    body: CompletionRequest, request_id: str, *, max_prompt_chars: int, max_new_tokens: int
) -> pb.GenerateRequest:
    """The engine request for a text completion (text or token-id prompt)."""
    _check_prompt_size(body, max_prompt_chars)
    request = pb.GenerateRequest(
        request_id=request_id, sampling=sampling_params(body, max_new_tokens), **_scheduling(body)
    )
    if isinstance(body.prompt, str):
        request.prompt = body.prompt
    else:
        request.prompt_token_ids.ids.extend(body.prompt)
    return request
