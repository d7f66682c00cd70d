"""The OpenAI response objects, for chat and for text completions, as plain dicts.

One interface (:class:`Format`), two variants: :class:`ChatFormat` produces
``chat.completion`` / ``chat.completion.chunk`` objects, :class:`TextFormat` produces
``text_completion`` objects (OpenAI uses the same object name for its chunks). Only one
choice (index 0) exists while ``n`` is limited to 1.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from jacana_common.errors import ApiError
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb

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


def finish_reason(reason: int) -> str:
    """OpenAI's finish_reason for an engine FinishReason; an abort is an error."""
    if reason == pb.FINISH_REASON_ABORT:
        raise ApiError(503, "The engine aborted the request.", None, "engine_aborted")
    return _FINISH.get(reason, "stop")


def usage(u: pb.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
    }


class Format(Protocol):
    """How one endpoint shapes its response and stream chunks."""

    chunk_object: str

    def new_id(self) -> str: ...

    def opening_chunks(self, env: Envelope) -> list[dict[str, Any]]: ...

    def text_chunk(self, env: Envelope, text: str) -> dict[str, Any]: ...

    def finish_chunk(self, env: Envelope, reason: str) -> dict[str, Any]: ...

    def response(
        self, env: Envelope, text: str, reason: str, used: dict[str, Any]
    ) -> dict[str, Any]: ...


def usage_chunk(fmt: Format, env: Envelope, used: dict[str, Any]) -> dict[str, Any]:
    """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
    return {**env.fields(fmt.chunk_object), "choices": [], "usage": used}


class ChatFormat:
    chunk_object = "chat.completion.chunk"

    def new_id(self) -> str:
        return f"chatcmpl-{uuid.uuid4().hex}"

    def _chunk(self, env: Envelope, delta: dict, reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {**env.fields(self.chunk_object), "choices": [choice]}

    def opening_chunks(self, env: Envelope) -> list[dict[str, Any]]:
        return [self._chunk(env, {"role": "assistant"}, None)]

    def text_chunk(self, env: Envelope, text: str) -> dict[str, Any]:
        return self._chunk(env, {"content": text}, None)

    def finish_chunk(self, env: Envelope, reason: str) -> dict[str, Any]:
        return self._chunk(env, {}, reason)

    def response(
        self, env: Envelope, text: str, reason: str, used: dict[str, Any]
    ) -> dict[str, Any]:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": reason,
        }
        return {**env.fields("chat.completion"), "choices": [choice], "usage": used}


class TextFormat:
    chunk_object = "text_completion"

    def new_id(self) -> str:
        return f"cmpl-{uuid.uuid4().hex}"

    def _choice(self, text: str, reason: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    def opening_chunks(self, env: Envelope) -> list[dict[str, Any]]:
        return []

    def text_chunk(self, env: Envelope, text: str) -> dict[str, Any]:
        return {**env.fields(self.chunk_object), "choices": [self._choice(text, None)]}

    def finish_chunk(self, env: Envelope, reason: str) -> dict[str, Any]:
        return {**env.fields(self.chunk_object), "choices": [self._choice("", reason)]}

    def response(
        self, env: Envelope, text: str, reason: str, used: dict[str, Any]
    ) -> dict[str, Any]:
        choices = [self._choice(text, reason)]
        return {**env.fields("text_completion"), "choices": choices, "usage": used}
