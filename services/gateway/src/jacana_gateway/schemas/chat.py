"""The request body of /v1/chat/completions: :class:`ChatCompletionRequest`, its messages
and its tools, as pydantic models (shared fields and rules: :mod:`.generation`).

- Message ``content`` is a string or a list of ``{"type": "text", "text": ...}`` parts;
  parts are joined with newlines. The ``developer`` role is sent to the engine as
  ``system``; the deprecated ``function`` role is refused.
- ``tool_calls`` only in assistant messages, ``tool_call_id`` only (and always) in tool
  messages. ``tool_choice`` is "none", "auto", "required" or a named function; what it
  asks of the engine is :mod:`jacana_gateway.translate.tool_calling`'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic import StrictBool as Bool
from pydantic import StrictInt as Int
from pydantic import StrictStr as Str

from jacana_gateway.schemas.generation import MAX_LOGPROBS, STRICT, GenerationRequest

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")

_CONTENT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                "required": ["type", "text"],
            },
        },
    ]
}

FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"
TOOL_CHOICES = ("none", "auto", "required")
_TOOL_CHOICE_SCHEMA = {
    "anyOf": [
        {"type": "string", "enum": list(TOOL_CHOICES)},
        {
            "type": "object",
            "properties": {
                "type": {"const": "function"},
                "function": {"type": "object", "properties": {"name": {"type": "string"}}},
            },
        },
    ]
}


class FunctionSpec(BaseModel):
    """A function the model may call (OpenAI's ``tools[].function``)."""

    model_config = STRICT

    name: Annotated[Str, Field(pattern=FUNCTION_NAME)]
    description: Str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON schema (an object).")
    strict: Bool | None = Field(None, description="Accepted; forced calls always follow it.")


class ToolSpec(BaseModel):
    """One entry of ``tools``."""

    model_config = STRICT

    type: Literal["function"]
    function: FunctionSpec


class CalledFunction(BaseModel):
    model_config = STRICT

    name: Str
    arguments: Str = Field(..., description="JSON text.")


class MessageToolCall(BaseModel):
    """One call an assistant message made (sent back in the conversation)."""

    model_config = STRICT

    id: Str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChosenFunction(BaseModel):
    model_config = STRICT

    name: Str


class NamedToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: ChosenFunction


class ChatMessage(BaseModel):
    """One message of a conversation."""

    model_config = STRICT

    role: Str = Field(..., description="system | developer | user | assistant | tool")
    # (before content, whose check reads it)
    tool_calls: list[MessageToolCall] | None = Field(
        None, description="An assistant message's calls."
    )
    content: Annotated[Any, WithJsonSchema(_CONTENT_SCHEMA)] = Field(
        None,
        validate_default=True,
        description="Text (null or left out only in an assistant message that calls tools).",
    )
    name: Str | None = None
    tool_call_id: Str | None = Field(None, description="A tool message: the call it answers.")
    refusal: Str | None = Field(None, description="Accepted and ignored.")

    @field_validator("role")
    @classmethod
    def _role(cls, role: str) -> str:
        if role == "function":
            raise ValueError(
                "'function' messages (the deprecated form) are not supported; use 'tool'"
            )
        if role not in CHAT_ROLES:
            raise ValueError(f"must be one of {', '.join(CHAT_ROLES)}")
        return role

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry 'tool_calls'")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the 'tool_call_id' it answers")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("only tool messages carry a 'tool_call_id'")
        return self

    @field_validator("content")
    @classmethod
    def _content(cls, content: Any, info: ValidationInfo) -> str | None:
        if content is None:
            if not info.data.get("tool_calls"):
                raise ValueError("is required (it may be null only beside 'tool_calls')")
            return None
        if isinstance(content, str):
            return content
        if not isinstance(content, list):
            raise ValueError("must be a string or an array of text parts")
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ValueError("only text content parts are supported")
            text = part.get("text")
            if not isinstance(text, str) or set(part) - {"type", "text"}:
                raise ValueError("a text part is {'type': 'text', 'text': <string>}")
            texts.append(text)
        return "\n".join(texts)


class ChatCompletionRequest(GenerationRequest):
    """Body of POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Annotated[Int, Field(ge=1)] | None = Field(
        None, description="Same as max_tokens (the newer name)."
    )
    add_generation_prompt: Bool = Field(
        True, description="Open an assistant turn after the last message."
    )
    logprobs: Bool | None = Field(None, description="Return each output token's logprob.")
    top_logprobs: Annotated[Int, Field(ge=0, le=MAX_LOGPROBS)] | None = Field(
        None, description="Most likely alternatives per token (needs logprobs: true)."
    )
    tools: list[ToolSpec] | None = Field(None, description="Functions the model may call.")
    tool_choice: Annotated[Any, WithJsonSchema(_TOOL_CHOICE_SCHEMA)] = Field(
        None,
        description="'auto' (the default with tools), 'none', 'required' (one or more "
        "calls) or {'type': 'function', 'function': {'name': ...}} (a call of that one).",
    )
    parallel_tool_calls: Bool | None = Field(
        None, description="false: a forced reply holds one call, not several."
    )
    functions: list[Any] | None = Field(None, description="Must be empty: no tools yet.")
    function_call: Any = Field(None, description="Only 'none'/'auto' without functions.")
    response_format: dict[str, Any] | None = Field(
        None,
        description="{'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', "
        "'json_schema': {'name': ..., 'schema': {...}}}: the output is held to it.",
    )
    modalities: list[Str] | None = Field(None, description="Only ['text'].")
    audio: Any = Field(None, description="Not supported.")
    prediction: Any = Field(None, description="Not supported.")
    reasoning_effort: Any = Field(None, description="Not supported.")
    web_search_options: Any = Field(None, description="Not supported.")

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, choice: Any) -> str | NamedToolChoice | None:
        if choice is None or choice in TOOL_CHOICES:
            return choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            try:
                return NamedToolChoice.model_validate(choice)
            except ValueError:
                pass
        raise ValueError(
            f"must be one of {', '.join(TOOL_CHOICES)} or "
            "{'type': 'function', 'function': {'name': <name>}}"
        )

    def prompt_chars(self) -> int:
        return sum(len(m.content or "") for m in self.messages)
