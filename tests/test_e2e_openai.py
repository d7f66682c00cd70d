"""End to end: the real engine and gateway processes, driven with the official openai SDK."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from stack import MODEL_ID

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain what a CPU does in one sentence.",
    "What is 12 times 12?",
    "Name a famous painting by Leonardo da Vinci.",
    "Give me a synonym for 'happy'.",
    "Translate 'good morning' into Spanish.",
]


def chat(client, content: str, **kw):
    return client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": content}],
        temperature=0,
        **kw,
    )


def test_capital_of_france_names_paris(client):
    resp = chat(client, "What is the capital of France?", max_tokens=32)
    choice = resp.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert resp.model == MODEL_ID
    assert resp.usage.prompt_tokens > 5
    assert 0 < resp.usage.completion_tokens <= 32
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_models_list_names_the_default_model(client):
    ids = [m.id for m in client.models.list().data]
    assert MODEL_ID in ids


def test_finish_reason_length_when_max_tokens_hit(client):
    resp = chat(client, "Write a long story about a dragon.", max_tokens=5)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 5


def test_completions_endpoint(client):
    resp = client.completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert resp.object == "text_completion"
    assert "Paris" in resp.choices[0].text
    assert resp.usage.completion_tokens <= 8


def test_stream_matches_non_stream_and_reports_usage(client):
    full = chat(client, PROMPTS[1], max_tokens=40)
    stream = chat(
        client, PROMPTS[1], max_tokens=40, stream=True, stream_options={"include_usage": True}
    )
    text, finish, usage, roles = [], None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        delta = chunk.choices[0].delta
        roles.append(delta.role)
        text.append(delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    assert roles[0] == "assistant"
    assert "".join(text) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_stop_string_ends_generation_before_it(client):
    free = chat(client, "Count from 1 to 20, separated by commas.", max_tokens=60)
    content = free.choices[0].message.content
    assert "5" in content, content
    cut = chat(client, "Count from 1 to 20, separated by commas.", max_tokens=60, stop=["5"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == content[: content.index("5")]


async def test_concurrent_streams_each_get_their_solo_output(client, async_client):
    solo = [chat(client, p, max_tokens=32).choices[0].message.content for p in PROMPTS]

    async def stream_one(prompt: str) -> str:
        parts = []
        stream = await async_client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=32,
            stream=True,
        )
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
        return "".join(parts)

    together = await asyncio.gather(*(stream_one(p) for p in PROMPTS))
    assert together == solo


def test_seeded_sampling_is_reproducible(client):
    kw = dict(max_tokens=24, temperature=0.9, seed=1234)
    a = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": PROMPTS[2]}], **kw
    )
    b = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": PROMPTS[2]}], **kw
    )
    assert a.choices[0].message.content == b.choices[0].message.content


# ---- bad input: OpenAI-shaped errors with the right status, never a 500 ----


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"n": 0}, "n"),
    ],
)
def test_invalid_parameters_are_400_with_param(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], **kwargs
        )
    assert info.value.status_code == 400
    err = info.value.body
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"
    assert err["message"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.body["param"] == "model"


def test_prompt_over_char_limit_is_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_ID, prompt="a" * 200_001, max_tokens=1)
    assert "200000" in info.value.body["message"]


def test_prompt_over_context_length_is_400_from_engine(client):
    # ~60k tokens: under the gateway's character limit, over the model's 8192-token context.
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_ID, prompt="hello " * 30_000, max_tokens=1)
    assert info.value.body["param"] in ("prompt", "max_tokens")
    assert info.value.body["code"] == "context_length_exceeded"
    assert "8192" in info.value.body["message"]
    # on chat the prompt is the messages
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, "hello " * 9_000, max_tokens=1)
    assert info.value.body["param"] == "messages"
    assert info.value.body["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1, 2]", b'{"model": "smollm2-135m-instruct"}', b'{"messages": []}'],
)
def test_malformed_bodies_are_400(gateway, body):
    resp = httpx.post(
        f"http://{gateway.address}/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert resp.status_code == 400, resp.text
    assert set(resp.json()["error"]) >= {"message", "type", "param", "code"}


def test_engine_unreachable_is_503(engine):
    from stack import free_port, start_gateway

    dead = f"127.0.0.1:{free_port()}"
    gw = start_gateway({MODEL_ID: [engine.address], "orphan": [dead]}, healthy=False)
    try:
        with openai.OpenAI(
            base_url=f"http://{gw.address}/v1", api_key="x", max_retries=0, timeout=30
        ) as c:
            with pytest.raises(openai.APIStatusError) as info:
                c.chat.completions.create(
                    model="orphan", messages=[{"role": "user", "content": "hi"}]
                )
            assert info.value.status_code == 503
            assert info.value.body["type"] == "service_unavailable_error"
        health = httpx.get(f"http://{gw.address}/health", timeout=10)
        assert health.status_code == 503
    finally:
        gw.stop()


# Odd but well-formed requests through the real gateway and engine: each ends in a 200 or
# in an OpenAI-shaped 400 naming its param (here None when the body is refused whole).
ODD_REQUESTS = [
    (
        "chat/completions",
        '{{"model": "{m}", "messages": [{{"role": "user", "content": "\\udcff"}}]}}',
        400,
        "messages[0].content",
    ),
    ("completions", '{{"model": "{m}", "prompt": [1000000000], "max_tokens": 2}}', 400, "prompt"),
    (
        "chat/completions",
        '{{"model": "{m}", "messages": [{{"role": "user", "content": "hi"}}], '
        '"logit_bias": {{"999999999": 1}}, "max_tokens": 2}}',
        400,
        "logit_bias",
    ),
    (
        "chat/completions",
        '{{"model": "{m}", "messages": [{{"role": "user", "content": ""}}], "max_tokens": 2}}',
        200,
        None,
    ),
    (
        "chat/completions",
        '{{"model": "{m}", "messages": [{{"role": "user", "content": "a\\u0000b '
        '\\ud83d\\ude00"}}], "stop": ["\\ud83d\\ude00"], "n": 3, "seed": 7, "max_tokens": 2}}',
        200,
        None,
    ),
    ("completions", '{{"model": "{m}", "prompt": "", "max_tokens": 2}}', 400, "prompt"),
    ("completions", b'{"model": "m", "prompt": "\xff"}', 400, None),
]


@pytest.mark.parametrize("path,body,status,param", ODD_REQUESTS)
def test_odd_requests_end_in_a_200_or_a_shaped_400(gateway, path, body, status, param):
    raw = body if isinstance(body, bytes) else body.format(m=MODEL_ID).encode()
    resp = httpx.post(
        f"http://{gateway.address}/v1/{path}",
        content=raw,
        headers={"content-type": "application/json"},
        timeout=120,
    )
    assert resp.status_code == status, resp.text
    if status == 400:
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["param"] == param, error
