"""Tool calling on chat: what ``tools`` and ``tool_choice`` ask of the engine, and how
the reply's calls come back. Pure functions, no I/O.

- ``tool_choice`` "none" (or no tools): a plain chat; the tools are not shown to the model.
- "auto" (the default with tools): the tools go to the model's template, which shows
  them; the reply may hold calls (Hermes format, :mod:`jacana_common.tool_calls`).
- "required": the same, and the reply is held to one or more calls of the tools by a
  grammar (one call only with ``parallel_tool_calls: false``).
- ``{"type": "function", "function": {"name": ...}}``: the reply is one call of that
  function, its arguments held to its ``parameters`` schema.
Where a reply holds calls, the message carries ``tool_calls`` (``content`` is the text
beside them, or null) and ``finish_reason`` is "tool_calls". A model whose template
renders no tools is refused by the engine (400, ``tools``).
"""

from __future__ import annotations

import json
import uuid

from jacana_common.errors import invalid_value
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_common.tool_calls import ToolCall
from jacana_gateway.schemas.chat import ChatCompletionRequest


def offered(body: ChatCompletionRequest) -> bool:
    """Whether the model sees the tools (and its reply is read for calls)."""
    return bool(body.tools) and body.tool_choice != "none"


def tools_json(body: ChatCompletionRequest) -> str:
    """The engine's ``ChatInput.tools``: the tools as JSON text, "" when not offered."""
    if not offered(body):
        return ""
    return json.dumps([t.model_dump(exclude_none=True) for t in body.tools])


def forced_guide(body: ChatCompletionRequest) -> pb.Guide | None:
    """The guide that holds a forced reply to calls ("required" or a named function),
    None otherwise; 400 for a choice that names no offered tool."""
    choice = body.tool_choice
    if choice is None or choice in ("none", "auto"):
        return None
    if not body.tools:
        raise invalid_value("'tool_choice' needs 'tools' to choose from.", "tool_choice")
    functions = [t.function for t in body.tools]
    several = body.parallel_tool_calls is not False
    if choice != "required":
        name = choice.function.name
        functions = [f for f in functions if f.name == name]
        if not functions:
            raise invalid_value(
                f"'tool_choice' names '{name}', which is not in 'tools'.", "tool_choice"
            )
        several = False
    spec = {
        "functions": [{"name": f.name, "parameters": f.parameters} for f in functions],
        "several": several,
    }
    return pb.Guide(tool_calls=json.dumps(spec), param="tool_choice")


def message_calls(calls) -> list[pb.ToolCall]:
    """An assistant message's ``tool_calls`` for the engine's template."""
    return [
        pb.ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in calls
    ]


def call_object(call: ToolCall, index: int | None = None) -> dict:
    """One call as OpenAI shows it (with its ``index`` in a streamed delta)."""
    out = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    return out if index is None else {"index": index, **out}
