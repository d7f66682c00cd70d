"""Rejects well-formed requests that ask for something Jacana does not do yet.

Each rule names a field, says which values mean "feature off" (accepted, so that clients
sending OpenAI defaults explicitly keep working) and why any other value is refused. A
refusal is a 400 with ``param`` = the field and ``code`` = ``"unsupported_parameter"``;
silently ignoring these fields would change what the client gets.

Refused when set to anything but their "off" value:
- both endpoints: ``stream_options`` without ``stream: true``;
- chat: the deprecated ``functions`` non-empty and ``function_call`` other than
  "none"/"auto" (``tools`` and ``tool_choice`` are :mod:`.tool_calling`'s),
  ``modalities`` other than ["text"], ``audio``, ``prediction``, ``reasoning_effort``,
  ``web_search_options``;
- completions: non-empty ``suffix``.
(``n``, penalties, ``logit_bias``, logprobs, ``echo`` and ``best_of`` are supported; their
combinations are checked in :mod:`.sampling`. ``response_format``
is :mod:`.structured_output`'s.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jacana_common.errors import ApiError
from jacana_gateway.errors import unsupported_parameter
from jacana_gateway.schemas.chat import ChatCompletionRequest
from jacana_gateway.schemas.generation import CompletionRequest, GenerationRequest


@dataclass(frozen=True)
class Rule:
    """``field`` is accepted while ``is_off(value)``; otherwise the request is refused."""

    field: str
    is_off: Callable[[Any], bool]
    why: str


def _unset_or(*allowed: Any) -> Callable[[Any], bool]:
    return lambda v: v is None or v in allowed


def _empty(value: Any) -> bool:
    return not value


_COMMON: tuple[Rule, ...] = ()

_CHAT = (
    Rule("functions", _empty, "the deprecated 'functions' are not supported; use 'tools'"),
    Rule(
        "function_call",
        _unset_or("none", "auto"),
        "the deprecated 'function_call' is not supported; use 'tool_choice'",
    ),
    Rule("modalities", lambda v: v is None or v == ["text"], "only text output is supported"),
    Rule("audio", _unset_or(), "audio output is not supported"),
    Rule("prediction", _unset_or(), "predicted outputs are not supported"),
    Rule("reasoning_effort", _unset_or(), "reasoning_effort is not supported by these models"),
    Rule("web_search_options", _unset_or(), "web search is not supported"),
)

_COMPLETION = (Rule("suffix", _unset_or(""), "suffix (insertion) is not supported yet"),)


def _check_rules(body: GenerationRequest, rules: tuple[Rule, ...]) -> None:
    for rule in rules:
        if not rule.is_off(getattr(body, rule.field)):
            raise unsupported_parameter(rule.field, rule.why)


def _check_stream_options(body: GenerationRequest) -> None:
    if body.stream_options is not None and not body.stream:
        raise ApiError(
            400,
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
            "invalid_value",
        )


def check_chat(body: ChatCompletionRequest) -> None:
    """Raise a 400 :class:`ApiError` when ``body`` asks for an unsupported chat feature."""
    _check_rules(body, _COMMON + _CHAT)
    _check_stream_options(body)


def check_completion(body: CompletionRequest) -> None:
    """Raise a 400 :class:`ApiError` when ``body`` asks for an unsupported completion feature."""
    _check_rules(body, _COMMON + _COMPLETION)
    _check_stream_options(body)
