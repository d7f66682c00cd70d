"""Tool calling in the gateway: what a request asks of the engine (the tools it shows,
the guide of a forced call) and how the engine's text comes back as ``tool_calls``,
streamed and whole."""

from __future__ import annotations

import json

import pytest

from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_gateway.schemas.chat import ChatCompletionRequest
from jacana_gateway.translate.generation_response import ChatFormat, Choice, Envelope
from jacana_gateway.translate.tool_calling import forced_guide, tools_json

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": PARAMS}},
    {"type": "function", "function": {"name": "time"}},
]
ENV = Envelope("chatcmpl-1", 0, "m", "fp")
PIECES = [
    "Let me check.",
    "\n<tool",
    '_call>\n{"name": "weather", ',
    '"arguments": {"city": "Oslo"}}\n</tool_call>',
]


def _body(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, **fields
    )


@pytest.mark.parametrize(
    ("fields", "names", "several"),
    [
        ({"tool_choice": "required"}, ["weather", "time"], True),
        ({"tool_choice": "required", "parallel_tool_calls": False}, ["weather", "time"], False),
        ({"tool_choice": {"type": "function", "function": {"name": "time"}}}, ["time"], False),
    ],
)
def test_a_forced_call_becomes_a_tool_call_guide(fields, names, several):
    guide = forced_guide(_body(**fields))
    spec = json.loads(guide.tool_calls)
    assert [f["name"] for f in spec["functions"]] == names and spec["several"] is several
    assert guide.param == "tool_choice"
    if "weather" in names:
        assert spec["functions"][0]["parameters"] == PARAMS


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_no_guide_unless_a_call_is_forced(choice):
    assert forced_guide(_body(tool_choice=choice)) is None


def test_the_tools_are_shown_unless_the_choice_is_none():
    shown = json.loads(tools_json(_body()))
    assert [t["function"]["name"] for t in shown] == ["weather", "time"]
    assert "strict" not in shown[0]["function"]  # unset fields are left out
    assert tools_json(_body(tool_choice="none")) == ""


def _messages(pieces: list[str], reason=pb.FINISH_REASON_STOP) -> list[pb.GenerateResponse]:
    out = [pb.GenerateResponse(index=0, text=p) for p in pieces]
    out[-1].finish_reason = reason
    return out


def _stream(fmt: ChatFormat, messages: list[pb.GenerateResponse]) -> list[dict]:
    choice, deltas = Choice(0), []
    for i, message in enumerate(messages):
        choice.add(message)
        deltas += [c["choices"][0] for c in fmt.delta_chunks(ENV, choice, message, i == 0)]
    deltas += [c["choices"][0] for c in fmt.finish_chunks(ENV, choice)]
    return deltas


def test_a_streamed_call_arrives_as_one_tool_calls_delta():
    deltas = _stream(ChatFormat(tools=True), _messages(PIECES))
    assert [d["delta"] for d in deltas[:1]] == [{"content": "Let me check."}]
    [call] = deltas[1]["delta"]["tool_calls"]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert deltas[-1] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}
    assert len(deltas) == 3


def test_a_whole_reply_carries_its_calls_and_content():
    choice = Choice(0)
    for message in _messages(PIECES):
        choice.add(message)
    [out] = ChatFormat(tools=True).response(ENV, [choice], {})["choices"]
    assert out["finish_reason"] == "tool_calls"
    assert out["message"]["content"] == "Let me check."
    [call] = out["message"]["tool_calls"]
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}


def test_a_reply_cut_short_keeps_its_length_reason():
    deltas = _stream(ChatFormat(tools=True), _messages(PIECES, pb.FINISH_REASON_LENGTH))
    assert deltas[-1]["finish_reason"] == "length"


def test_without_tools_the_text_is_content_as_it_came():
    deltas = _stream(ChatFormat(), _messages(PIECES))
    assert "".join(d["delta"].get("content", "") for d in deltas) == "".join(PIECES)
    assert deltas[-1]["finish_reason"] == "stop"
