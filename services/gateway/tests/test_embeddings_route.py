"""POST /v1/embeddings: OpenAI request validation, translation to the embeddings gRPC API,
both encodings, error mapping, replica failover and client disconnects.

The embeddings services here are fakes on free loopback ports: each answers with vectors
derived from its inputs (so order and values are checkable) or with a scripted error,
or holds the call open until it is cancelled. The real service is driven end to end in
tests/test_e2e_embeddings.py.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from jacana_common.errors import grpc_details
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2 as pb
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2_grpc
from jacana_gateway.config import GatewaySettings
from jacana_gateway.embeddings_route import (
    EMBEDDINGS_SERVICE,
    MAX_INPUTS,
    EmbeddingsBackends,
    embeddings_router,
)
from jacana_gateway.errors import install_error_handlers

MODEL = "embed-model"
URL = "/v1/embeddings"


def vectors_for(request: pb.EmbedRequest) -> np.ndarray:
    """[N, 4] float32: (index, input length, 1/3, -0.25); 1/3 is not exact in float32."""
    if request.WhichOneof("input") == "texts":
        sizes = [len(t) for t in request.texts.texts]
    else:
        sizes = [len(t.ids) for t in request.token_ids.inputs]
    rows = [[i, n, 1 / 3, -0.25] for i, n in enumerate(sizes)]
    return np.array(rows, dtype="<f4")


class FakeEmbeddings(embeddings_pb2_grpc.EmbeddingsServicer):
    def __init__(self) -> None:
        self.requests: list[pb.EmbedRequest] = []
        self.error: tuple[grpc.StatusCode, str, str | None] | None = None
        self.hang = False
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def Embed(self, request, context):
        self.requests.append(request)
        self.started.set()
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if self.error is not None:
            code, message, param = self.error
            await context.abort(code, grpc_details(message, param))
        vectors = vectors_for(request)
        return pb.EmbedResponse(
            embeddings=[pb.Embedding(packed=v.tobytes(), num_tokens=int(v[1])) for v in vectors],
            dimension=vectors.shape[1],
            usage=pb.Usage(
                prompt_tokens=int(vectors[:, 1].sum()), total_tokens=int(vectors[:, 1].sum())
            ),
        )


@dataclass
class Fake:
    servicer: FakeEmbeddings
    server: grpc.aio.Server
    address: str
    health: health.aio.HealthServicer

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else 2  # NOT_SERVING
        await self.health.set(EMBEDDINGS_SERVICE, status)


@pytest.fixture
async def make_fake() -> AsyncIterator[Callable[[], Awaitable[Fake]]]:
    """Start fake embeddings services on demand; all are stopped after the test."""
    running: list[Fake] = []

    async def start() -> Fake:
        server = grpc.aio.server()
        servicer = FakeEmbeddings()
        embeddings_pb2_grpc.add_EmbeddingsServicer_to_server(servicer, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        running.append(Fake(servicer, server, f"127.0.0.1:{port}", health_servicer))
        await running[-1].set_serving(True)
        return running[-1]

    yield start
    for f in running:
        await f.server.stop(0)


@pytest.fixture
async def fake(make_fake) -> Fake:
    return await make_fake()


@pytest.fixture
def gateway(make_settings, make_client, dead_address):
    """``gateway(embeddings, **settings)``: the real gateway app, in-process; its LLM
    engine address is dead (nothing here needs one)."""

    def open_client(embeddings: dict[str, list[str]], **overrides):
        settings = make_settings({"llm": [dead_address()]}, embeddings=embeddings, **overrides)
        return make_client(settings)

    return open_client


@asynccontextmanager
async def router_only(backends: EmbeddingsBackends) -> AsyncIterator[httpx.AsyncClient]:
    """The router alone on a bare app (as another app would mount it)."""
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(embeddings_router(backends, timeout_s=10))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield client


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
    np.testing.assert_array_equal(floats, vectors_for(fake.servicer.requests[0]))
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


async def test_a_dead_replica_is_skipped_then_tried_last(fake, dead_address):
    dead = dead_address()
    backends = EmbeddingsBackends({MODEL: [dead, fake.address]})
    async with router_only(backends) as client:
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
    from jacana_gateway.config import GatewaySettings

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
