"""Tool calls in the Hermes format, the one Qwen2.5, Qwen3 and the Hermes models are
trained on: each call is a JSON object between tags,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The format in one place, for both sides: the engine holds a forced call
(``tool_choice`` "required" or a named function) to :func:`lark_grammar`; the gateway
reads calls out of the text with :class:`ToolCallParser`, streamed or whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


def parse_call(body: str) -> ToolCall | None:
    """The call in the text between the tags, None when it is not one (not JSON, no
    string ``name``, ``arguments`` not an object)."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models send the arguments already as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _held_back(text: str) -> int:
    """How many trailing characters of ``text`` might begin a call (a prefix of the
    opening tag, with the whitespace before it): they wait for the next text."""
    hold = 0
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            hold = k
            break
    cut = len(text) - hold
    while cut > 0 and text[cut - 1].isspace():
        cut -= 1
    return len(text) - cut


class ToolCallParser:
    """Splits a reply's text, as it streams, into plain text and calls.

    ``feed(text)`` and then ``finish()`` return the events in order: ``str`` pieces of
    the reply's content and :class:`ToolCall`s. Text that might open a call is held back
    until it is known not to; a block between the tags that is not a call stays text. At
    the end, an unclosed block (the reply was cut) is a call if its text is one, and
    whitespace between or around calls is dropped.
    """

    def __init__(self) -> None:
        self._pending = ""
        self._inside = False
        self._gap = ""  # the whitespace before an open block
        self.calls = 0

    def feed(self, text: str) -> list[str | ToolCall]:
        self._pending += text
        events: list[str | ToolCall] = []
        while True:
            if self._inside:
                end = self._pending.find(CLOSE)
                if end < 0:
                    return events
                self._close(self._pending[:end], events)
                self._pending = self._pending[end + len(CLOSE) :]
                continue
            start = self._pending.find(OPEN)
            if start >= 0:
                before = self._pending[:start]
                self._text(before.rstrip(), events)
                self._gap = before[len(before.rstrip()) :]  # back in if no call follows
                self._pending = self._pending[start + len(OPEN) :]
                self._inside = True
                continue
            cut = len(self._pending) - _held_back(self._pending)
            self._text(self._pending[:cut], events)
            self._pending = self._pending[cut:]
            return events

    def finish(self) -> list[str | ToolCall]:
        events: list[str | ToolCall] = []
        if self._inside:
            self._inside = False
            self._close(self._pending, events, closed=False)
        elif not (self.calls and not self._pending.strip()):
            self._text(self._pending, events)
        self._pending = ""
        return events

    def _text(self, text: str, events: list[str | ToolCall]) -> None:
        if self.calls:  # after a call, only what is not whitespace is content
            text = text.strip()
        if text:
            events.append(text)

    def _close(self, body: str, events: list[str | ToolCall], closed: bool = True) -> None:
        self._inside = False
        call = parse_call(body)
        if call is None:
            self._text(self._gap + OPEN + body + (CLOSE if closed else ""), events)
            return
        self.calls += 1
        events.append(call)


def split_reply(text: str) -> tuple[str, list[ToolCall]]:
    """A whole reply's content (its text pieces joined) and its calls."""
    parser = ToolCallParser()
    events = parser.feed(text) + parser.finish()
    content = "".join(e for e in events if isinstance(e, str))
    return content, [e for e in events if isinstance(e, ToolCall)]


def lark_grammar(
    functions: Sequence[dict[str, Any]], several: bool, tag: Callable[[str], str]
) -> str:
    """An llguidance Lark grammar for a reply made only of calls to ``functions``
    (``[{"name": ..., "parameters": <JSON schema>}]``): one call, or one or more
    (``several``). ``tag(text)`` is the grammar item for a tag (a special token, or a
    quoted string where the vocabulary has none)."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    call = f'{tag(OPEN)} "\\n" %json {json.dumps(schema)} "\\n" {tag(CLOSE)}'
    start = 'start: call ("\\n" call)*' if several else "start: call"
    return f"{start}\ncall: {call}\n"
