"""Engine failures become the right HTTP errors, quickly, and never a 500 or a hang."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
TEXT = {"prompt": "hi"}


def finished(text: str = "ok", reason=pb.FINISH_REASON_STOP) -> pb.GenerateResponse:
    usage = pb.Usage(prompt_tokens=1, completion_tokens=1)
    return pb.GenerateResponse(text=text, finish_reason=reason, usage=usage)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "fields"), [("/v1/chat/completions", CHAT), ("/v1/completions", TEXT)]
)
async def test_unreachable_engine_is_a_fast_503(client, model, path, fields, stream):
    body = {"model": model, "stream": stream, **fields}
    resp = await asyncio.wait_for(client.post(path, json=body), timeout=10)
    assert resp.status_code == 503
    error = resp.json()["error"]
    assert error["code"] == "engine_unavailable" and error["type"] == "service_unavailable_error"
    assert "127.0.0.1" not in error["message"]  # internal addresses stay in the log


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_invalid_argument_is_a_400_with_its_param(
    make_client, make_settings, engine, script, stream
):
    engine.servicer.script = script(
        error=(
            grpc.StatusCode.INVALID_ARGUMENT,
            "prompt has 9000 tokens, context is 8192",
            "messages",
        )
    )
    async with make_client(make_settings({"m": [engine.address]})) as client:
        resp = await client.post(
            "/v1/chat/completions", json={"model": "m", "stream": stream, **CHAT}
        )
    assert resp.status_code == 400
    assert resp.json() == {
        "error": {
            "message": "prompt has 9000 tokens, context is 8192",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "invalid_value",  # a field named, no code given
        }
    }


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.INTERNAL, 503),
        (grpc.StatusCode.UNKNOWN, 503),
        (grpc.StatusCode.FAILED_PRECONDITION, 400),
    ],
)
async def test_engine_status_codes_map_to_http(
    make_client, make_settings, engine, script, code, status
):
    engine.servicer.script = script(error=(code, "nope", None))
    async with make_client(make_settings({"m": [engine.address]})) as client:
        resp = await client.post("/v1/completions", json={"model": "m", **TEXT})
    assert resp.status_code == status
    assert resp.json()["error"]["message"] == "nope"


async def test_engine_that_ends_without_finishing_is_a_503(
    make_client, make_settings, engine, script
):
    engine.servicer.script = script([pb.GenerateResponse(text="half")])
    async with make_client(make_settings({"m": [engine.address]})) as client:
        resp = await client.post("/v1/completions", json={"model": "m", **TEXT})
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_error"
        engine.servicer.script = script([])
        resp = await client.post("/v1/completions", json={"model": "m", **TEXT})
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_error"


async def test_engine_abort_is_a_503(make_client, make_settings, engine, script):
    engine.servicer.script = script([finished("", pb.FINISH_REASON_ABORT)])
    async with make_client(make_settings({"m": [engine.address]})) as client:
        resp = await client.post("/v1/completions", json={"model": "m", **TEXT})
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_aborted"


async def test_deadline_is_a_504_and_cancels_the_engine_call(
    make_client, make_settings, engine, script
):
    engine.servicer.script = script(hang=True)
    config = make_settings({"m": [engine.address]}, request_timeout_s=0.3)
    async with make_client(config) as client:
        resp = await asyncio.wait_for(
            client.post("/v1/completions", json={"model": "m", **TEXT}), 10
        )
    assert resp.status_code == 504
    assert resp.json()["error"]["type"] == "timeout_error"
    await asyncio.wait_for(engine.servicer.cancelled_event.wait(), 5)


async def test_a_dead_replica_is_skipped_for_a_live_one(
    make_client, make_settings, engine, script, dead_address
):
    engine.servicer.script = script([finished()])
    config = make_settings({"m": [dead_address(), engine.address, dead_address()]})
    async with make_client(config) as client:
        for _ in range(6):  # rotation starts on every replica at least twice
            resp = await client.post("/v1/completions", json={"model": "m", **TEXT})
            assert resp.status_code == 200, resp.text
    assert len(engine.servicer.requests) == 6
