"""The OpenAI response objects, for chat and for text completions, as plain dicts.

One interface (:class:`Format`), two variants: :class:`ChatFormat` produces
``chat.completion`` / ``chat.completion.chunk`` objects, :class:`TextFormat` produces
``text_completion`` objects (OpenAI uses the same object name for its chunks). A format
instance is made per request and carries what that request asked to see (logprobs,
echo). Every choice has its ``index``; streamed chunks carry one choice each.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from jacana_common.errors import ApiError
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_common.tool_calls import ToolCall, ToolCallParser, split_reply
from jacana_gateway.translate import logprobs as lp
from jacana_gateway.translate import tool_calling

_FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length"}


@dataclass(frozen=True)
class Envelope:
    """What every object of one response repeats."""

    id: str
    created: int
    model: str
    system_fingerprint: str

    def fields(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
        }


@dataclass
class Choice:
    """One choice as the engine streams it: what has arrived so far, and how it ended.

    ``offset`` counts the characters of token strings already reported (completions'
    ``text_offset``); ``started`` is False until the first message arrived.
    """

    index: int
    text: list[str] = field(default_factory=list)
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    prompt_text: str | None = None
    reason: str | None = None
    usage: pb.Usage | None = None
    started: bool = False
    offset: int = 0

    def add(self, message: pb.GenerateResponse) -> None:
        """Record one engine message of this choice."""
        if not self.started:
            self.started = True
            self.prompt_logprobs.extend(message.prompt_logprobs)
            if message.HasField("prompt_text"):
                self.prompt_text = message.prompt_text
        self.text.append(message.text)
        self.logprobs.extend(message.logprobs)
        if message.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            self.reason = finish_reason(message.finish_reason)
            self.usage = message.usage


def finish_reason(reason: int) -> str:
    """OpenAI's finish_reason for an engine FinishReason; an abort is an error."""
    if reason == pb.FINISH_REASON_ABORT:
        raise ApiError(503, "The engine aborted the request.", None, "engine_aborted")
    return _FINISH.get(reason, "stop")


def usage_of(parts: list[pb.Usage]) -> dict[str, Any]:
    """One usage object for several choices of one prompt: the prompt counted once, the
    completions summed, cached tokens as the least any choice had."""
    prompt = parts[0].prompt_tokens if parts else 0
    completion = sum(u.completion_tokens for u in parts)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": min((u.cached_prompt_tokens for u in parts), default=0)
        },
    }


class Format(Protocol):
    """How one endpoint shapes its response and stream chunks."""

    chunk_object: str

    def new_id(self) -> str: ...

    def opening_chunks(self, env: Envelope, index: int) -> list[dict[str, Any]]:
        """Chunks that open choice ``index`` before any text."""
        ...

    def delta_chunks(
        self, env: Envelope, choice: Choice, message: pb.GenerateResponse, first: bool
    ) -> list[dict[str, Any]]:
        """Chunks for one engine ``message`` of ``choice`` (``first``: its first one)."""
        ...

    def finish_chunks(self, env: Envelope, choice: Choice) -> list[dict[str, Any]]:
        """Chunks that close ``choice`` (it has its ``reason``): any text held back, then
        the finish reason."""
        ...

    def response(
        self, env: Envelope, choices: list[Choice], used: dict[str, Any]
    ) -> dict[str, Any]: ...


def usage_chunk(fmt: Format, env: Envelope, used: dict[str, Any]) -> dict[str, Any]:
    """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
    return {**env.fields(fmt.chunk_object), "choices": [], "usage": used}


class ChatFormat:
    """``top_logprobs``: None without logprobs, else the alternatives shown per token.
    ``tools``: the model was offered tools, so its replies are read for calls
    (:mod:`jacana_common.tool_calls`): a call streams as one ``tool_calls`` delta once its
    closing tag is in, and text that might open one is held back until it cannot."""

    chunk_object = "chat.completion.chunk"

    def __init__(self, top_logprobs: int | None = None, tools: bool = False) -> None:
        self.top_logprobs = top_logprobs
        self.tools = tools
        self._parsers: dict[int, ToolCallParser] = {}  # choice index -> its parser

    def new_id(self) -> str:
        return f"chatcmpl-{uuid.uuid4().hex}"

    def _logprobs(self, entries: list[pb.TokenLogprob]) -> dict[str, Any] | None:
        if self.top_logprobs is None:
            return None
        return {"content": lp.chat_content(entries, self.top_logprobs), "refusal": None}

    def _chunk(
        self, env: Envelope, index: int, delta: dict, reason: str | None, logprobs=None
    ) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        return {**env.fields(self.chunk_object), "choices": [choice]}

    def opening_chunks(self, env: Envelope, index: int) -> list[dict[str, Any]]:
        return [self._chunk(env, index, {"role": "assistant"}, None)]

    def delta_chunks(
        self, env: Envelope, choice: Choice, message: pb.GenerateResponse, first: bool
    ) -> list[dict[str, Any]]:
        logprobs = self._logprobs(list(message.logprobs)) if message.logprobs else None
        if not self.tools:
            if not message.text and logprobs is None:
                return []
            return [self._chunk(env, choice.index, {"content": message.text}, None, logprobs)]
        parser = self._parsers.setdefault(choice.index, ToolCallParser())
        chunks = self._event_chunks(env, choice.index, parser, parser.feed(message.text))
        if logprobs is not None:
            if chunks:
                chunks[0]["choices"][0]["logprobs"] = logprobs
            else:
                chunks.append(self._chunk(env, choice.index, {"content": ""}, None, logprobs))
        return chunks

    def _event_chunks(
        self, env: Envelope, index: int, parser: ToolCallParser, events: list
    ) -> list[dict[str, Any]]:
        """One chunk per run of text and one per call; a call's ``index`` counts the calls
        of its choice."""
        chunks, seen = [], parser.calls - sum(isinstance(e, ToolCall) for e in events)
        for event in events:
            if isinstance(event, ToolCall):
                delta = {"tool_calls": [tool_calling.call_object(event, seen)]}
                chunks.append(self._chunk(env, index, delta, None))
                seen += 1
            else:
                chunks.append(self._chunk(env, index, {"content": event}, None))
        return chunks

    def finish_chunks(self, env: Envelope, choice: Choice) -> list[dict[str, Any]]:
        parser = self._parsers.pop(choice.index, None)
        chunks = []
        if parser is not None:
            chunks = self._event_chunks(env, choice.index, parser, parser.finish())
        reason = self._reason(choice.reason, parser.calls if parser is not None else 0)
        return [*chunks, self._chunk(env, choice.index, {}, reason)]

    @staticmethod
    def _reason(reason: str | None, calls: int) -> str | None:
        return "tool_calls" if calls and reason == "stop" else reason

    def _message(self, choice: Choice) -> dict[str, Any]:
        text = "".join(choice.text)
        if not self.tools:
            return {"role": "assistant", "content": text}
        content, calls = split_reply(text)
        if not calls:
            return {"role": "assistant", "content": content}
        return {
            "role": "assistant",
            "content": content or None,
            "tool_calls": [tool_calling.call_object(c) for c in calls],
        }

    def response(
        self, env: Envelope, choices: list[Choice], used: dict[str, Any]
    ) -> dict[str, Any]:
        out = []
        for c in choices:
            message = self._message(c)
            out.append(
                {
                    "index": c.index,
                    "message": message,
                    "logprobs": self._logprobs(c.logprobs),
                    "finish_reason": self._reason(c.reason, len(message.get("tool_calls", []))),
                }
            )
        return {**env.fields("chat.completion"), "choices": out, "usage": used}


class TextFormat:
    """``logprobs``: None without logprobs. ``echo``: prepend the prompt to each choice,
    the client's ``prompt`` string when it sent one, else the engine's text of the ids."""

    chunk_object = "text_completion"

    def __init__(
        self, logprobs: int | None = None, echo: bool = False, prompt: str | None = None
    ) -> None:
        self.logprobs = logprobs
        self.echo = echo
        self.prompt = prompt

    def new_id(self) -> str:
        return f"cmpl-{uuid.uuid4().hex}"

    def _echo_text(self, choice: Choice) -> str:
        return self.prompt if self.prompt is not None else choice.prompt_text or ""

    def _logprobs(self, entries: list[pb.TokenLogprob], choice: Choice) -> dict[str, Any]:
        """Logprobs of ``entries``, the next tokens of ``choice``; advances its offset."""
        shaped = lp.completion_logprobs(entries, choice.offset)
        choice.offset += lp.text_length(entries)
        return shaped

    def _chunk(self, env: Envelope, index: int, text: str, reason, logprobs=None):
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
        return {**env.fields(self.chunk_object), "choices": [choice]}

    def opening_chunks(self, env: Envelope, index: int) -> list[dict[str, Any]]:
        return []

    def delta_chunks(
        self, env: Envelope, choice: Choice, message: pb.GenerateResponse, first: bool
    ) -> list[dict[str, Any]]:
        chunks = []
        if first and self.echo:
            prompt_lp = None
            if self.logprobs is not None:
                prompt_lp = self._logprobs(list(message.prompt_logprobs), choice)
            chunks.append(self._chunk(env, choice.index, self._echo_text(choice), None, prompt_lp))
        logprobs = None
        if self.logprobs is not None and message.logprobs:
            logprobs = self._logprobs(list(message.logprobs), choice)
        if message.text or logprobs is not None:
            chunks.append(self._chunk(env, choice.index, message.text, None, logprobs))
        return chunks

    def finish_chunks(self, env: Envelope, choice: Choice) -> list[dict[str, Any]]:
        return [self._chunk(env, choice.index, "", choice.reason)]

    def response(
        self, env: Envelope, choices: list[Choice], used: dict[str, Any]
    ) -> dict[str, Any]:
        out = []
        for c in choices:
            text = "".join(c.text)
            logprobs = None
            if self.echo:
                text = self._echo_text(c) + text
            if self.logprobs is not None:
                entries = (c.prompt_logprobs if self.echo else []) + c.logprobs
                logprobs = lp.completion_logprobs(entries, 0)
            out.append(
                {"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": c.reason}
            )
        return {**env.fields("text_completion"), "choices": out, "usage": used}
