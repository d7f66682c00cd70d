"""The gateway's translation between OpenAI HTTP and the engine's gRPC, over real gRPC.

The engine here is the conftest's RecordingEngine: it answers with scripted messages and
records what it received, so these tests check the request the gateway sends and the
HTTP/SSE framing it builds — not model output (that is the end-to-end suite's job).
"""

from __future__ import annotations

import json

from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb


def delta(text: str) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=text, token_ids=[11])


def last(text: str = "", reason=pb.FINISH_REASON_STOP, prompt=7, completion=3, cached=4):
    usage = pb.Usage(
        prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=cached
    )
    return pb.GenerateResponse(text=text, token_ids=[12], finish_reason=reason, usage=usage)


def sse_events(raw: str) -> list[str]:
    """The data payloads of an SSE body, checking the framing on the way."""
    assert raw.endswith("\n\n"), raw[-50:]
    events = raw.split("\n\n")[:-1]
    for event in events:
        assert event.startswith("data: ") and "\n" not in event, event
    return [e.removeprefix("data: ") for e in events]


async def test_chat_request_is_forwarded_faithfully(make_client, make_settings, engine, script):
    engine.servicer.script = script([last("fine")])
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                "name": "ann",
            },
            {"role": "assistant", "content": "earlier"},
            {"role": "user", "content": "go"},
        ],
        "temperature": 0.25,
        "top_p": 0.5,
        "top_k": 40,
        "min_p": 0.05,
        "seed": -1,
        "max_completion_tokens": 33,
        "stop": "\n\n",
        "stop_token_ids": [2, 7],
        "ignore_eos": True,
        "add_generation_prompt": False,
    }
    async with make_client(make_settings({"m": [engine.address]})) as client:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    [sent] = engine.servicer.requests
    assert sent.request_id == resp.json()["id"] == resp.headers["x-request-id"]
    assert sent.WhichOneof("input") == "chat"
    assert [(m.role, m.content, m.name) for m in sent.chat.messages] == [
        ("system", "be brief", ""),
        ("system", "sys", ""),
        ("user", "a\nb", "ann"),
        ("assistant", "earlier", ""),
        ("user", "go", ""),
    ]
    assert sent.chat.add_generation_prompt is False
    s = sent.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens) == (0.25, 0.5, 40, 33)
    assert abs(s.min_p - 0.05) < 1e-7
    assert s.HasField("seed") and s.seed == 2**64 - 1
    assert list(s.stop) == ["\n\n"]
    assert list(s.stop_token_ids) == [2, 7]
    assert s.ignore_eos is True
    assert s.clamp_max_tokens is False  # an explicit max_tokens is not lowered by the engine


async def test_unset_fields_get_openai_defaults(make_client, make_settings, engine, script):
    engine.servicer.script = script([last("x")])
    config = make_settings({"m": [engine.address]}, max_new_tokens=321)
    async with make_client(config) as client:
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
        text = {"model": "m", "prompt": "once"}
        assert (await client.post("/v1/completions", json=text)).status_code == 200
        with_null = {"model": "m", "prompt": "once", "max_tokens": None, "top_k": -1}
        assert (await client.post("/v1/completions", json=with_null)).status_code == 200
        nulls = {**chat, "max_tokens": None, "max_completion_tokens": None}
        assert (await client.post("/v1/chat/completions", json=nulls)).status_code == 200
    chat_req, text_req, null_req, null_chat_req = engine.servicer.requests
    s = chat_req.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.max_tokens) == (1.0, 1.0, 0, 0.0, 321)
    assert s.clamp_max_tokens is True  # the server cap, lowered to fit the context
    assert not s.HasField("seed") and list(s.stop) == [] and s.ignore_eos is False
    assert chat_req.chat.add_generation_prompt is True
    assert text_req.prompt == "once" and text_req.sampling.max_tokens == 16  # OpenAI's default
    assert text_req.sampling.clamp_max_tokens is False
    # an explicit null is the omitted value: 16, never the server's whole limit
    assert null_req.sampling.max_tokens == 16 and null_req.sampling.top_k == 0
    assert null_req.sampling.clamp_max_tokens is False
    assert null_chat_req.sampling.max_tokens == 321
    assert null_chat_req.sampling.clamp_max_tokens is True


async def test_completion_default_is_capped_by_the_server_limit(
    make_client, make_settings, engine, script
):
    engine.servicer.script = script([last("x")])
    config = make_settings({"m": [engine.address]}, max_new_tokens=8)
    async with make_client(config) as client:
        for body in (
            {"model": "m", "prompt": "a"},
            {"model": "m", "prompt": "a", "max_tokens": None},
        ):
            assert (await client.post("/v1/completions", json=body)).status_code == 200
        too_many = {"model": "m", "prompt": "a", "max_tokens": 9}
        assert (await client.post("/v1/completions", json=too_many)).status_code == 400
    assert [r.sampling.max_tokens for r in engine.servicer.requests] == [8, 8]


async def test_completion_prompt_forms(make_client, make_settings, engine, script):
    engine.servicer.script = script([last("x")])
    async with make_client(make_settings({"m": [engine.address]})) as client:
        for prompt in ("", "text", ["text in a list"], [1, 2, 3], [[4, 5]]):
            resp = await client.post("/v1/completions", json={"model": "m", "prompt": prompt})
            assert resp.status_code == 200, (prompt, resp.text)
    inputs = [
        (r.WhichOneof("input"), r.prompt if r.HasField("prompt") else list(r.prompt_token_ids.ids))
        for r in engine.servicer.requests
    ]
    assert inputs == [
        ("prompt", ""),
        ("prompt", "text"),
        ("prompt", "text in a list"),
        ("prompt_token_ids", [1, 2, 3]),
        ("prompt_token_ids", [4, 5]),
    ]


async def test_non_streaming_responses(make_client, make_settings, engine, script):
    engine.servicer.script = script(
        [delta("Hel"), delta(""), delta("lo"), last("!", pb.FINISH_REASON_LENGTH)]
    )
    async with make_client(make_settings({"m": [engine.address]})) as client:
        chat = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        )
        text = await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
    body = chat.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "m" and isinstance(body["created"], int)
    assert body["system_fingerprint"].startswith("jacana-")
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello!"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    body = text.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"] == [
        {"index": 0, "text": "Hello!", "logprobs": None, "finish_reason": "length"}
    ]
    assert body["usage"]["total_tokens"] == 10


async def test_chat_stream_framing(make_client, make_settings, engine, script):
    engine.servicer.script = script(
        [delta("Hi"), delta(""), delta(" there"), last("", pb.FINISH_REASON_STOP)]
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with make_client(make_settings({"m": [engine.address]})) as client:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all("usage" not in c for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert deltas == [{"role": "assistant"}, {"content": "Hi"}, {"content": " there"}, {}]
    assert reasons == [None, None, None, "stop"]


async def test_stream_include_usage_adds_a_usage_chunk(make_client, make_settings, engine, script):
    engine.servicer.script = script([delta("a"), last("b", pb.FINISH_REASON_LENGTH)])
    async with make_client(make_settings({"m": [engine.address]})) as client:
        chat = await client.post(
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        text = await client.post(
            "/v1/completions",
            json={
                "model": "m",
                "prompt": "x",
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    for resp, obj in ((chat, "chat.completion.chunk"), (text, "text_completion")):
        events = sse_events(resp.text)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        *body, final = chunks
        assert all(c["usage"] is None and len(c["choices"]) == 1 for c in body)
        assert body[-1]["choices"][0]["finish_reason"] == "length"
        assert final["object"] == obj and final["choices"] == []
        assert final["usage"]["completion_tokens"] == 3 and final["usage"]["total_tokens"] == 10
    texts = [json.loads(e)["choices"][0]["text"] for e in sse_events(text.text)[:-2]]
    assert texts == ["a", "b", ""]


async def test_error_after_the_first_byte_is_an_error_event(
    make_client, make_settings, engine, script
):
    import grpc

    engine.servicer.script = script(
        [delta("partial")], error=(grpc.StatusCode.INTERNAL, "kv cache on fire", None)
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with make_client(make_settings({"m": [engine.address]})) as client:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200  # the status line went out with the first chunk
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["message"] == "kv cache on fire" and error["type"] == "service_unavailable_error"
    assert json.loads(events[1])["choices"][0]["delta"] == {"content": "partial"}


async def test_scheduling_extensions_are_forwarded(make_client, make_settings, engine, script):
    engine.servicer.script = script([last("x")])
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "priority": -3,
        "cache_salt": "tenant-a",
        "disable_speculation": True,
    }
    text = {"model": "m", "prompt": "once", "disable_speculation": False}
    async with make_client(make_settings({"m": [engine.address]})) as client:
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
        assert (await client.post("/v1/completions", json=text)).status_code == 200
        assert (
            await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
        ).status_code == 200
        bad = {"model": "m", "prompt": "p", "disable_speculation": "yes"}
        resp = await client.post("/v1/completions", json=bad)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "disable_speculation"
    chat_req, text_req, default_req = engine.servicer.requests
    assert (chat_req.priority, chat_req.cache_salt) == (-3, "tenant-a")
    assert chat_req.disable_speculation is True
    assert text_req.disable_speculation is False and default_req.disable_speculation is False
    assert (default_req.priority, default_req.cache_salt) == (0, "")
