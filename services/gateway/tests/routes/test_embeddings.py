"""POST /v1/embeddings: OpenAI request validation, translation to the embeddings gRPC API,
both encodings, error mapping, replica failover and client disconnects.

The embeddings services here are fakes on free loopback ports (``routes/conftest.py``):
each answers with vectors derived from its inputs (so order and values are checkable) or
with a scripted error, or holds the call open until it is cancelled. The real service is
driven end to end in tests/test_e2e_embeddings.py.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import grpc
import httpx
import numpy as np
import pytest

from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2 as pb
from jacana_gateway.app import create_app
from jacana_gateway.schemas.embeddings import MAX_INPUTS
from jacana_gateway.settings import GatewaySettings

MODEL = "embed-model"
URL = "/v1/embeddings"


@pytest.fixture
def gateway(make_settings, make_client, dead_address):
    """``gateway(embeddings, **settings)``: the real gateway app, in-process; its LLM
    engine address is dead (nothing here needs one)."""

    def open_client(embeddings: dict[str, list[str]], **overrides):
        settings = make_settings({"llm": [dead_address()]}, embeddings=embeddings, **overrides)
        return make_client(settings)

    return open_client


@pytest.fixture
async def client(gateway, fake) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway({MODEL: [fake.address]}) as c:
        yield c


def assert_error(resp: httpx.Response, status: int, param: str | None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    assert error["message"]
    return error


async def test_float_and_base64_give_identical_vectors(client, fake):
    texts = ["hello", "a longer text"]
    as_float = (await client.post(URL, json={"model": MODEL, "input": texts})).json()
    as_b64 = (
        await client.post(URL, json={"model": MODEL, "input": texts, "encoding_format": "base64"})
    ).json()
    floats = np.array([d["embedding"] for d in as_float["data"]], dtype=np.float64)
    # What the official SDK does with base64: little-endian float32.
    decoded = np.stack(
        [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in as_b64["data"]]
    ).astype(np.float64)
    np.testing.assert_array_equal(floats, decoded)
    np.testing.assert_array_equal(floats, fake.servicer.vectors_for(fake.servicer.requests[0]))
    assert floats[0, 2] == np.float32(1 / 3)  # float32 values, exactly
    assert as_float["object"] == "list" and as_float["model"] == MODEL
    assert [d["index"] for d in as_float["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in as_float["data"])
    assert as_float["usage"] == {"prompt_tokens": 18, "total_tokens": 18}


@pytest.mark.parametrize(
    "value, kind, expected",
    [
        ("one text", "texts", ["one text"]),
        (["a", "bb", "ccc"], "texts", ["a", "bb", "ccc"]),
        ([101, 7592, 102], "token_ids", [[101, 7592, 102]]),
        ([[101, 102], [101, 2023, 102]], "token_ids", [[101, 102], [101, 2023, 102]]),
    ],
)
async def test_every_input_shape_reaches_the_service(client, fake, value, kind, expected):
    resp = await client.post(URL, json={"model": MODEL, "input": value})
    assert resp.status_code == 200, resp.text
    (sent,) = fake.servicer.requests
    assert sent.WhichOneof("input") == kind
    got = (
        list(sent.texts.texts) if kind == "texts" else [list(t.ids) for t in sent.token_ids.inputs]
    )
    assert got == expected
    assert len(resp.json()["data"]) == len(expected)
    assert sent.encoding == pb.VECTOR_ENCODING_PACKED_FLOAT32


async def test_options_are_forwarded(client, fake):
    body = {"model": MODEL, "input": "x", "dimensions": 64, "truncate": True, "user": "u1"}
    assert (await client.post(URL, json=body)).status_code == 200
    sent = fake.servicer.requests[0]
    assert sent.HasField("dimensions") and sent.dimensions == 64 and sent.truncate
    plain = {"model": MODEL, "input": "x"}
    assert (await client.post(URL, json=plain)).status_code == 200
    assert not fake.servicer.requests[1].HasField("dimensions")
    assert not fake.servicer.requests[1].truncate
    assert fake.servicer.requests[1].model == ""  # the gateway's name is not the service's


BAD = [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [""]}, "input"),
    ({"input": ["ok", ""]}, "input"),
    ({"input": ["a", 1]}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [[1], []]}, "input"),
    ({"input": [[1], "a"]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": [[2**32]]}, "input"),
    ({"input": [1.5]}, "input"),
    ({"input": [True]}, "input"),
    ({"input": True}, "input"),
    ({"input": None}, "input"),
    ({"input": {"text": "a"}}, "input"),
    ({"input": ["x"] * (MAX_INPUTS + 1)}, "input"),
    ({"input": [[1]] * (MAX_INPUTS + 1)}, "input"),
    ({"input": "x", "encoding_format": "binary"}, "encoding_format"),
    ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "dimensions": "64"}, "dimensions"),
    ({"input": "x", "truncate": "yes"}, "truncate"),
    ({"input": "x", "model": ""}, "model"),
    ({"input": "x", "colour": "blue"}, "colour"),
    ({}, "input"),
]


@pytest.mark.parametrize("body, param", BAD)
async def test_bad_requests_are_400s_before_any_service_call(client, fake, body, param):
    resp = await client.post(URL, json={"model": MODEL, **body})
    assert_error(resp, 400, param)
    assert fake.servicer.requests == []


async def test_limits_are_inclusive(client, fake):
    resp = await client.post(URL, json={"model": MODEL, "input": ["x"] * MAX_INPUTS})
    assert resp.status_code == 200 and len(resp.json()["data"]) == MAX_INPUTS


async def test_unknown_model_is_404(client, fake):
    error = assert_error(await client.post(URL, json={"model": "nope", "input": "x"}), 404, "model")
    assert error["code"] == "model_not_found"


@pytest.mark.parametrize(
    "code, param, status",
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "dimensions", 400),
        (grpc.StatusCode.INVALID_ARGUMENT, "input", 400),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, None, 429),
        (grpc.StatusCode.INTERNAL, None, 503),
    ],
)
async def test_service_errors_keep_their_status_and_param(client, fake, code, param, status):
    fake.servicer.error = (code, "the service says no", param)
    error = assert_error(await client.post(URL, json={"model": MODEL, "input": "x"}), status, param)
    assert error["message"] == "the service says no"


async def test_unreachable_service_is_503(gateway, dead_address):
    async with gateway({MODEL: [dead_address()]}) as client:
        assert_error(await client.post(URL, json={"model": MODEL, "input": "x"}), 503, None)


async def test_a_dead_replica_is_skipped_then_tried_last(
    make_settings, make_client, fake, dead_address
):
    dead = dead_address()
    settings = make_settings({"llm": [dead_address()]}, embeddings={MODEL: [dead, fake.address]})
    app = create_app(settings)
    backends = app.state.gateway.embeddings
    async with make_client(app) as client:
        for _ in range(3):
            resp = await client.post(URL, json={"model": MODEL, "input": "x"})
            assert resp.status_code == 200, resp.text
        failed = {r.target for r in backends.pool.replicas(MODEL) if r.failed_at > float("-inf")}
    assert len(fake.servicer.requests) == 3
    assert failed == {dead}  # failed once, then not tried first again


async def test_least_busy_replica_first(gateway, make_fake):
    busy, idle = await make_fake(), await make_fake()
    busy.servicer.hang = True
    async with gateway({MODEL: [busy.address, idle.address]}) as client:
        stuck = asyncio.create_task(client.post(URL, json={"model": MODEL, "input": "x"}))
        await asyncio.wait_for(busy.servicer.started.wait(), 5)
        for _ in range(3):
            assert (await client.post(URL, json={"model": MODEL, "input": "y"})).status_code == 200
        assert len(idle.servicer.requests) == 3 and len(busy.servicer.requests) == 1
        stuck.cancel()


async def test_api_keys_apply(gateway, fake):
    async with gateway({MODEL: [fake.address]}, api_keys=["sk-1"]) as client:
        body = {"model": MODEL, "input": "x"}
        assert (await client.post(URL, json=body)).status_code == 401
        ok = await client.post(URL, json=body, headers={"Authorization": "Bearer sk-1"})
        assert ok.status_code == 200
    assert len(fake.servicer.requests) == 1


async def test_body_limit_applies(gateway, fake):
    async with gateway({MODEL: [fake.address]}, max_body_bytes=4096) as client:
        resp = await client.post(URL, json={"model": MODEL, "input": ["word"] * 2000})
        assert_error(resp, 413, None)
    assert fake.servicer.requests == []


async def test_client_disconnect_cancels_the_service_call(make_settings, serve, fake, dead_address):
    fake.servicer.hang = True
    settings = make_settings({"llm": [dead_address()]}, embeddings={MODEL: [fake.address]})
    async with serve(settings) as url, httpx.AsyncClient() as http:
        request = asyncio.create_task(http.post(f"{url}{URL}", json={"model": MODEL, "input": "x"}))
        await asyncio.wait_for(fake.servicer.started.wait(), 5)
        request.cancel()  # the client gives up: its connection closes
        await asyncio.wait_for(fake.servicer.cancelled.wait(), 5)


def test_settings_validate_embedding_endpoints(make_settings):
    assert make_settings(embeddings={MODEL: ["127.0.0.1:1"]}).embeddings == {MODEL: ["127.0.0.1:1"]}
    for bad in ({MODEL: ["not an address"]}, {MODEL: []}, {"bad id": ["127.0.0.1:1"]}):
        with pytest.raises(ValueError):
            GatewaySettings(engines={"llm": ["127.0.0.1:1"]}, embeddings=bad)


# --- embedding models in the rest of the gateway: models, health, embeddings alone ---------


async def test_models_list_embedding_models_after_generation_models(gateway, fake):
    async with gateway({MODEL: [fake.address], "other-embedder": [fake.address]}) as client:
        body = (await client.get("/v1/models")).json()
        assert [m["id"] for m in body["data"]] == ["llm", MODEL, "other-embedder"]
        card = (await client.get(f"/v1/models/{MODEL}")).json()
        assert card["id"] == MODEL and card["object"] == "model"
        assert card["owned_by"] == "jacana" and isinstance(card["created"], int)
        assert card == body["data"][1]


async def test_health_covers_embeddings_replicas(make_client, make_engine, make_fake, dead_address):
    engine, a, b = await make_engine(), await make_fake(), await make_fake()
    settings = GatewaySettings(
        engines={"llm": [engine.address]},
        embeddings={MODEL: [dead_address(), a.address], "solo": [b.address]},
    )
    async with make_client(settings) as client:
        resp = await client.get("/health")
        assert resp.status_code == 200, resp.text
        models = resp.json()["models"]
        assert models["llm"]["kind"] == "generation"
        assert models[MODEL]["kind"] == "embeddings"
        assert models[MODEL]["healthy_replicas"] == 1
        assert models[MODEL]["replicas"][a.address] == "serving"
        assert models["solo"]["replicas"] == {b.address: "serving"}
        # The only replica of "solo" stops serving: the gateway is no longer healthy.
        await b.set_serving(False)
        resp = await client.get("/health")
        assert resp.status_code == 503
        body = resp.json()
        assert body["models"]["solo"]["replicas"][b.address] == "unavailable"
        assert "solo" in body["error"]["message"] and MODEL not in body["error"]["message"]


async def test_a_gateway_can_serve_embeddings_alone(make_client, fake):
    settings = GatewaySettings(embeddings={MODEL: [fake.address]})
    assert settings.engines == {}
    async with make_client(settings) as client:
        health_resp = await client.get("/health")
        assert health_resp.status_code == 200, health_resp.text
        assert list(health_resp.json()["models"]) == [MODEL]
        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == [MODEL]
        resp = await client.post(URL, json={"model": MODEL, "input": "x"})
        assert resp.status_code == 200, resp.text
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        error = assert_error(await client.post("/v1/chat/completions", json=chat), 400, "model")
        assert error["code"] == "model_not_supported" and "/v1/embeddings" in error["message"]
        completion = {"model": MODEL, "prompt": "hi"}
        assert_error(await client.post("/v1/completions", json=completion), 400, "model")
        chat["model"] = "nope"
        assert_error(await client.post("/v1/chat/completions", json=chat), 404, "model")
    assert len(fake.servicer.requests) == 1
