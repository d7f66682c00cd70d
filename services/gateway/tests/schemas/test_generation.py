"""Bad requests get OpenAI-shaped 4xx errors before any engine is called.

The gateway under test has only a dead engine address: a request that got past
validation would come back 503, so each expected 400/404/413 proves it was caught first.
"""

from __future__ import annotations

import json

import pytest

MODEL = "test-model"  # the model the conftest gateways serve

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "Once upon a time", **fields}


def assert_error(resp, status: int, param: str | None, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

# (path, body, expected param). Every one of these must be a 400.
BAD_PARAMS = [
    (CHAT, chat(temperature=-0.1), "temperature"),
    (CHAT, chat(temperature=2.5), "temperature"),
    (CHAT, chat(temperature="hot"), "temperature"),
    (CHAT, chat(temperature=True), "temperature"),
    (CHAT, chat(top_p=0), "top_p"),
    (CHAT, chat(top_p=1.01), "top_p"),
    (CHAT, chat(top_p="1"), "top_p"),
    (CHAT, chat(max_tokens=0), "max_tokens"),
    (CHAT, chat(max_tokens=-5), "max_tokens"),
    (CHAT, chat(max_tokens=1.5), "max_tokens"),
    (CHAT, chat(max_completion_tokens=0), "max_completion_tokens"),
    (CHAT, chat(n=0), "n"),
    (CHAT, chat(n="2"), "n"),
    (CHAT, chat(seed="abc"), "seed"),
    (CHAT, chat(stream="yes"), "stream"),
    (CHAT, chat(stop=5), "stop"),
    (CHAT, chat(stop=[""]), "stop"),
    (CHAT, chat(stop=["x"] * 17), "stop"),
    (CHAT, chat(top_k=-2), "top_k"),
    (CHAT, chat(min_p=1.5), "min_p"),
    (CHAT, chat(stop_token_ids=[-1]), "stop_token_ids[0]"),
    (
        CHAT,
        chat(stream=True, stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
    ),
    (CHAT, chat(model=""), "model"),
    (CHAT, chat(model=7), "model"),
    (CHAT, {"model": MODEL}, "messages"),
    (CHAT, chat(messages=[]), "messages"),
    (CHAT, chat(messages="hello"), "messages"),
    (CHAT, chat(messages=["hello"]), "messages[0]"),
    (CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role"),
    (CHAT, chat(messages=[{"content": "hi"}]), "messages[0].role"),
    (CHAT, chat(messages=[{"role": "user"}]), "messages[0].content"),
    (CHAT, chat(messages=[{"role": "user", "content": None}]), "messages[0].content"),
    (CHAT, chat(messages=[{"role": "user", "content": 42}]), "messages[0].content"),
    (
        CHAT,
        chat(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": {}}]),
        "messages[1].content",
    ),
    (
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "messages[0].content",
    ),
    (CHAT, chat(messages=[{"role": "user", "content": "hi", "mood": 1}]), "messages[0].mood"),
    (CHAT, chat(temprature=0.5), "temprature"),
    (COMPLETIONS, {"model": MODEL}, "prompt"),
    (COMPLETIONS, completion(prompt=None), "prompt"),
    (COMPLETIONS, completion(prompt=[]), "prompt"),
    (COMPLETIONS, completion(prompt=["a", "b"]), "prompt"),
    (COMPLETIONS, completion(prompt=[1, -2]), "prompt"),
    (COMPLETIONS, completion(prompt={"text": "x"}), "prompt"),
    (COMPLETIONS, completion(temperature=3), "temperature"),
    (COMPLETIONS, completion(max_tokens=0), "max_tokens"),
    (COMPLETIONS, completion(top_p=-1), "top_p"),
    # structured output: the shape is the gateway's to check
    (CHAT, chat(response_format={"type": "yaml"}), "response_format.type"),
    (CHAT, chat(response_format={}), "response_format.type"),
    (CHAT, chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
    (
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
        "response_format.json_schema.name",
    ),
    (
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"name": "a b"}}),
        "response_format.json_schema.name",
    ),
    (
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}),
        "response_format.json_schema.schema",
    ),
    (CHAT, chat(response_format="json"), "response_format"),
    (CHAT, chat(guided_json=[1]), "guided_json"),
    (CHAT, chat(guided_regex=""), "guided_regex"),
    (COMPLETIONS, completion(guided_choice=[]), "guided_choice"),
    (COMPLETIONS, completion(guided_choice=["a", ""]), "guided_choice[1]"),
    (COMPLETIONS, completion(guided_choice="a"), "guided_choice"),
    (CHAT, chat(response_format={"type": "json_object"}, guided_regex="a"), "guided_regex"),
    (COMPLETIONS, completion(guided_json={}, guided_choice=["a"]), "guided_choice"),
    # tool calling
    (CHAT, chat(tools=[{"type": "function", "function": {}}]), "tools[0].function.name"),
    (
        CHAT,
        chat(tools=[{"type": "function", "function": {"name": "a b"}}]),
        "tools[0].function.name",
    ),
    (CHAT, chat(tools=[{"type": "retrieval"}]), "tools[0].type"),
    (CHAT, chat(tools=[TOOL], tool_choice="sometimes"), "tool_choice"),
    (CHAT, chat(tool_choice="required"), "tool_choice"),
    (CHAT, chat(tools=[TOOL], tool_choice={"type": "function", "function": {}}), "tool_choice"),
    (CHAT, chat(tools=[TOOL], tool_choice={"type": "function"}), "tool_choice"),
    (
        CHAT,
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
        "tool_choice",
    ),
    (
        CHAT,
        chat(tools=[TOOL], tool_choice="required", response_format={"type": "json_object"}),
        "response_format",
    ),
    (CHAT, chat(messages=[{"role": "tool", "content": "42"}]), "messages[0]"),
    (CHAT, chat(messages=[{"role": "user", "content": "a", "tool_call_id": "c"}]), "messages[0]"),
    (CHAT, chat(messages=[{"role": "assistant", "content": None}]), "messages[0].content"),
    (
        CHAT,
        chat(messages=[{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]),
        "messages[0].tool_calls[0].function",
    ),
    (
        CHAT,
        chat(messages=[{"role": "user", "content": "x", "tool_calls": [CALL]}]),
        "messages[0]",
    ),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD_PARAMS)
async def test_invalid_parameter_is_a_400_naming_it(client, path, body, param):
    assert_error(await client.post(path, json=body), 400, param)


# Well-formed, but asking for something not implemented: 400 unsupported_parameter.
UNSUPPORTED = [
    (CHAT, chat(functions=[{"name": "f"}]), "functions"),
    (CHAT, chat(modalities=["text", "audio"]), "modalities"),
    (CHAT, chat(reasoning_effort="high"), "reasoning_effort"),
    (COMPLETIONS, completion(suffix="!"), "suffix"),
]


@pytest.mark.parametrize(("path", "body", "param"), UNSUPPORTED)
async def test_unsupported_feature_is_a_400_naming_it(client, path, body, param):
    error = assert_error(await client.post(path, json=body), 400, param, "unsupported_parameter")
    assert "support" in error["message"]


async def test_the_deprecated_function_role_is_refused(client):
    body = chat(messages=[{"role": "function", "content": "42", "name": "f"}])
    error = assert_error(await client.post(CHAT, json=body), 400, "messages[0].role")
    assert "not supported" in error["message"]


async def test_stream_options_without_stream_is_refused(client):
    body = chat(stream_options={"include_usage": True})
    assert_error(await client.post(CHAT, json=body), 400, "stream_options")


async def test_off_values_of_unsupported_features_pass_validation(client):
    # OpenAI defaults sent explicitly are not refused: the request reaches the (dead) engine.
    body = chat(
        n=1,
        logprobs=False,
        top_logprobs=0,
        tools=[],
        tool_choice="none",
        presence_penalty=0,
        frequency_penalty=0.0,
        logit_bias={},
        response_format={"type": "text"},
        user="u-1",
        metadata={"k": "v"},
        store=False,
        parallel_tool_calls=True,
        max_completion_tokens=5,
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "bob"},
            {"role": "assistant", "content": "hello", "refusal": None},
            {"role": "user", "content": "again"},
        ],
    )
    assert_error(await client.post(CHAT, json=body), 503, None, "engine_unavailable")
    text = completion(n=1, echo=False, best_of=1, suffix="", user="x", prompt=[[1, 2, 3]])
    assert_error(await client.post(COMPLETIONS, json=text), 503, None, "engine_unavailable")


GUIDED = [
    (CHAT, chat(response_format={"type": "json_object"})),
    (
        CHAT,
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": {"type": "object"}, "strict": True},
            }
        ),
    ),
    (CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "any"}})),
    (CHAT, chat(response_format={"type": "text"}, guided_regex="[a-z]+")),
    (COMPLETIONS, completion(guided_json={"type": "integer"})),
    (COMPLETIONS, completion(guided_choice=["yes", "no"])),
]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_a_null_stream_is_no_stream(client, path):
    body = (chat if path == CHAT else completion)(stream=None)
    assert_error(await client.post(path, json=body), 503, None, "engine_unavailable")


TOOL_REQUESTS = [
    chat(tools=[TOOL]),
    chat(tools=[TOOL], tool_choice="auto"),
    chat(tools=[TOOL], tool_choice="none", response_format={"type": "json_object"}),
    chat(tools=[TOOL], tool_choice="required", parallel_tool_calls=False),
    chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}}),
    chat(
        tools=[TOOL],
        messages=[
            {"role": "user", "content": "call f"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ],
    ),
]


@pytest.mark.parametrize("body", TOOL_REQUESTS)
async def test_well_formed_tool_requests_pass_to_the_engine(client, body):
    assert_error(await client.post(CHAT, json=body), 503, None, "engine_unavailable")


@pytest.mark.parametrize(("path", "body"), GUIDED)
async def test_well_formed_structured_output_passes_to_the_engine(client, path, body):
    assert_error(await client.post(path, json=body), 503, None, "engine_unavailable")


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_malformed_json_is_a_400(client, path):
    resp = await client.post(
        path, content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"}
    )
    error = assert_error(resp, 400, None, "invalid_json")
    assert "JSON" in error["message"]


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"42", b"null"])
async def test_body_that_is_not_an_object_is_a_400(client, raw):
    resp = await client.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert_error(resp, 400, None, "invalid_body")


async def test_missing_body_is_a_400(client):
    assert_error(await client.post(CHAT), 400, None, "invalid_body")


async def test_json_without_content_type_is_accepted(client):
    resp = await client.post(CHAT, content=json.dumps(chat()).encode())
    assert "content-type" not in resp.request.headers
    assert_error(resp, 503, None, "engine_unavailable")  # parsed, validated, sent on


async def test_non_json_content_type_is_a_400(client):
    resp = await client.post(
        CHAT, content=json.dumps(chat()), headers={"content-type": "text/plain"}
    )
    error = assert_error(resp, 400, None, "invalid_body")
    assert "application/json" in error["message"]


async def test_nan_temperature_is_a_400(client):
    raw = b'{"model": "test-model", "messages": [{"role": "user", "content": "x"}], '
    raw += b'"temperature": NaN}'
    resp = await client.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert_error(resp, 400, "temperature")


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_unknown_model_is_a_404(client, path):
    body = chat(model="gpt-7") if path == CHAT else completion(model="gpt-7")
    error = assert_error(await client.post(path, json=body), 404, "model", "model_not_found")
    assert "gpt-7" in error["message"]


async def test_prompt_longer_than_limit_is_a_400(make_client, make_settings):
    async with make_client(make_settings(max_prompt_chars=100)) as client:
        ok_size = await client.post(
            CHAT, json=chat(messages=[{"role": "user", "content": "x" * 100}])
        )
        assert ok_size.status_code == 503  # at the limit: reaches the (dead) engine
        long_chat = chat(
            messages=[
                {"role": "system", "content": "x" * 60},
                {"role": "user", "content": "y" * 41},
            ]
        )
        assert_error(await client.post(CHAT, json=long_chat), 400, "messages", "prompt_too_long")
        long_text = completion(prompt="z" * 101)
        assert_error(
            await client.post(COMPLETIONS, json=long_text), 400, "prompt", "prompt_too_long"
        )
        long_ids = completion(prompt=list(range(101)))
        assert_error(
            await client.post(COMPLETIONS, json=long_ids), 400, "prompt", "prompt_too_long"
        )


async def test_max_tokens_above_server_limit_is_a_400(make_client, make_settings):
    async with make_client(make_settings(max_new_tokens=64)) as client:
        assert_error(await client.post(CHAT, json=chat(max_tokens=65)), 400, "max_tokens")
        body = chat(max_completion_tokens=65)
        assert_error(await client.post(CHAT, json=body), 400, "max_completion_tokens")
        assert_error(
            await client.post(COMPLETIONS, json=completion(max_tokens=1000)), 400, "max_tokens"
        )
        at_limit = await client.post(CHAT, json=chat(max_tokens=64))
        assert at_limit.status_code == 503


async def test_conflicting_max_tokens_aliases_are_a_400(client):
    body = chat(max_tokens=5, max_completion_tokens=6)
    assert_error(await client.post(CHAT, json=body), 400, "max_completion_tokens")


async def test_body_above_size_limit_is_a_413(make_client, make_settings):
    async with make_client(make_settings(max_body_bytes=2048)) as client:
        body = chat(messages=[{"role": "user", "content": "x" * 4096}])
        assert_error(await client.post(CHAT, json=body), 413, None, "request_too_large")

        async def chunked():  # no Content-Length: counted while it arrives
            raw = json.dumps(body).encode()
            for i in range(0, len(raw), 512):
                yield raw[i : i + 512]

        resp = await client.post(CHAT, content=chunked())
        assert "content-length" not in resp.request.headers
        assert_error(resp, 413, None, "request_too_large")
        small = await client.post(CHAT, json=chat())
        assert small.status_code == 503  # under the limit: reaches the (dead) engine


ODD_VALUES = [
    None,
    True,
    False,
    -1,
    0,
    1,
    2.5,
    1e308,
    -(2**70),
    2**70,
    "",
    "x",
    "\u0000",
    [],
    [1],
    ["a"],
    [None],
    [[]],
    {},
    {"a": 1},
    {"type": "text"},
]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_any_odd_value_of_any_field_gets_a_shaped_4xx_or_reaches_the_engine(client, path):
    from jacana_gateway.schemas.chat import ChatCompletionRequest
    from jacana_gateway.schemas.generation import CompletionRequest

    schema = ChatCompletionRequest if path == CHAT else CompletionRequest
    base = chat() if path == CHAT else completion()
    fields = [*schema.model_fields, "messages.0.role", "messages.0.content", "stream_options"]
    for name in fields:
        for value in ODD_VALUES:
            body = json.loads(json.dumps(base))
            if name.startswith("messages.") and path == CHAT:
                body["messages"][0][name.split(".")[2]] = value
            else:
                body[name] = value
            resp = await client.post(path, json=body)
            # 503: valid enough to be sent on (to the dead engine). Anything else is a 4xx.
            assert resp.status_code in (400, 404, 503), (name, value, resp.text)
            error = resp.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, (name, value)
            if resp.status_code == 400 and error["code"] != "invalid_body":
                assert error["param"], (name, value, error)


LONE = "\\udcff"  # a JSON escape of an unpaired surrogate: valid JSON, not Unicode text
PAIRED = "\\ud83d\\ude00"  # one character (an emoji), escaped as a surrogate pair

# (path, raw body with {s} where the escape goes, the param named)
SURROGATE_PLACES = [
    (
        CHAT,
        '{{"model": "test-model", "messages": [{{"role": "user", "content": "a{s}"}}]}}',
        "messages[0].content",
    ),
    (
        CHAT,
        '{{"model": "test-model", "messages": [{{"role": "user", "content": '
        '[{{"type": "text", "text": "{s}"}}]}}]}}',
        "messages[0].content[0].text",
    ),
    (
        CHAT,
        '{{"model": "test-model", "messages": [{{"role": "user", "content": "hi"}}], '
        '"stop": ["x", "{s}"]}}',
        "stop[1]",
    ),
    (
        CHAT,
        '{{"model": "test-model", "messages": [{{"role": "user", "content": "hi"}}], '
        '"metadata": {{"{s}": "v"}}}}',
        "metadata",
    ),
    (
        CHAT,
        '{{"model": "test-model{s}", "messages": [{{"role": "user", "content": "hi"}}]}}',
        "model",
    ),
    (COMPLETIONS, '{{"model": "test-model", "prompt": "hi", "{s}": 1}}', None),  # a key
    (COMPLETIONS, '{{"model": "test-model", "prompt": "{s}"}}', "prompt"),
    (COMPLETIONS, '{{"model": "test-model", "prompt": ["ok", "{s}"]}}', "prompt[1]"),
    ("/v1/embeddings", '{{"model": "test-model", "input": ["ok", "{s}"]}}', "input[1]"),
]


@pytest.mark.parametrize("path,template,param", SURROGATE_PLACES)
async def test_an_unpaired_surrogate_is_a_400_naming_its_field(client, path, template, param):
    raw = template.format(s=LONE).encode()
    resp = await client.post(path, content=raw, headers={"content-type": "application/json"})
    error = assert_error(resp, 400, param, "invalid_value")
    assert "surrogate" in error["message"]
    # the same place with a paired escape is text: it gets past validation
    raw = template.format(s=PAIRED).encode()
    resp = await client.post(path, content=raw, headers={"content-type": "application/json"})
    assert resp.status_code != 400 or resp.json()["error"]["param"] != param, resp.text


UNPARSABLE = [
    (b"[" * 100_000 + b"]" * 100_000, "too deeply"),
    (b'{"model": "test-model", "max_tokens": 1' + b"0" * 5000 + b"}", "number too long"),
    (b'{"model": "test-model", "prompt": "\xff\xfe"}', "UTF-8"),
]


@pytest.mark.parametrize("raw,why", UNPARSABLE, ids=["deep", "long number", "not utf-8"])
async def test_a_body_the_json_decoder_cannot_read_is_a_400_saying_why(client, raw, why):
    for path in (CHAT, COMPLETIONS, "/v1/embeddings"):
        resp = await client.post(path, content=raw, headers={"content-type": "application/json"})
        error = assert_error(resp, 400, None, "invalid_json")
        assert why in error["message"], (path, error)
