"""The Hermes tool-call format: whole replies and the same replies streamed in any split
give the same content and calls; text that only looks like a call stays text."""

from __future__ import annotations

import json

import pytest

from jacana_common.tool_calls import ToolCall, ToolCallParser, lark_grammar, split_reply

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TIME = '{"name": "get_time", "arguments": {"zone": "CET"}}'

# reply -> (content, calls)
REPLIES = {
    "plain text": ("The weather is fine.", []),
    "one call": (
        f"<tool_call>\n{WEATHER}\n</tool_call>",
        [ToolCall("get_weather", '{"city": "Paris"}')],
    ),
    "text, then two calls": (
        f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{TIME}\n</tool_call>",
        [ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("get_time", '{"zone": "CET"}')],
    ),
    "not json inside the tags": ("See:\n<tool_call>\nnot json\n</tool_call>", []),
    "a name that is not a string": ('<tool_call>{"name": 3}</tool_call>', []),
    "arguments as JSON text": (
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>',
        [ToolCall("f", '{"x": 1}')],
    ),
    "cut before the closing tag": (
        f"<tool_call>\n{WEATHER}\n",
        [ToolCall("get_weather", '{"city": "Paris"}')],
    ),
    "cut inside the json": ('<tool_call>\n{"name": "get_weather", "argu', []),
    "a tag's prefix that is not one": ("a <tool_cal> b <tool", []),
    "unicode": (
        '<tool_call>{"name": "f", "arguments": {"s": "é✓"}}</tool_call>',
        [ToolCall("f", '{"s": "é✓"}')],
    ),
}
CONTENT = {
    "plain text": "The weather is fine.",
    "one call": "",
    "text, then two calls": "Let me check.",
    "not json inside the tags": "See:\n<tool_call>\nnot json\n</tool_call>",
    "a name that is not a string": '<tool_call>{"name": 3}</tool_call>',
    "arguments as JSON text": "",
    "cut before the closing tag": "",
    "cut inside the json": '<tool_call>\n{"name": "get_weather", "argu',
    "a tag's prefix that is not one": "a <tool_cal> b <tool",
    "unicode": "",
}


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_a_whole_reply_splits_into_content_and_calls(name):
    reply, calls = REPLIES[name]
    assert split_reply(reply) == (CONTENT[name], calls)


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_any_streamed_split_gives_the_whole_replys_events(name):
    reply, _ = REPLIES[name]
    whole = split_reply(reply)
    for size in (1, 2, 3, 5, 7, 11):
        parser = ToolCallParser()
        events = []
        for i in range(0, len(reply), size):
            events += parser.feed(reply[i : i + size])
        events += parser.finish()
        content = "".join(e for e in events if isinstance(e, str))
        assert (content, [e for e in events if isinstance(e, ToolCall)]) == whole, size


def test_text_that_may_open_a_call_is_held_back_until_it_cannot():
    parser = ToolCallParser()
    assert parser.feed("Sure. <tool") == ["Sure."]
    assert parser.feed("box> is here") == [" <toolbox> is here"]
    assert parser.feed("\n\n") == []  # whitespace waits: a call may follow
    assert parser.feed("<tool_call>") == []
    assert parser.feed(WEATHER + "</tool_call>") == [ToolCall("get_weather", '{"city": "Paris"}')]
    assert parser.feed("\n") == [] and parser.finish() == []
    assert parser.calls == 1


def test_a_grammar_for_forced_calls_names_each_function():
    functions = [
        {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        {"name": "b", "parameters": None},
    ]
    one = lark_grammar(functions[:1], several=False, tag=json.dumps)
    assert one.splitlines()[0] == "start: call"
    assert '"<tool_call>"' in one and '"</tool_call>"' in one
    several = lark_grammar(functions, several=True, tag=lambda t: t)
    assert "start: call" in several and "call)*" in several
    assert "<tool_call> " in several and '{"const": "b"}' in several and '{"const": "a"}' in several
