"""The gRPC surface, served in-process by the real GrpcServer on a free loopback port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jacana_common.errors import api_error_from_grpc
from jacana_common.grpc_client import make_channel
from jacana_common.grpc_server import GrpcServer
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2 as pb
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2_grpc
from jacana_embeddings.__main__ import SERVICE_NAME
from jacana_embeddings.server import EmbeddingsServicer
from jacana_embeddings.settings import EmbeddingsSettings


@pytest.fixture
def batcher_config() -> dict:
    return {}


@pytest.fixture
async def channel(make_service, batcher_config) -> AsyncIterator[grpc.aio.Channel]:
    service = make_service(**batcher_config)
    server = GrpcServer(SERVICE_NAME, EmbeddingsSettings(port=0, shutdown_grace_s=1))
    embeddings_pb2_grpc.add_EmbeddingsServicer_to_server(EmbeddingsServicer(service), server.server)
    port = await server.start()
    async with make_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    await server.stop()


@pytest.fixture
def stub(channel) -> embeddings_pb2_grpc.EmbeddingsStub:
    return embeddings_pb2_grpc.EmbeddingsStub(channel)


def texts_request(texts, **fields) -> pb.EmbedRequest:
    return pb.EmbedRequest(texts=pb.TextInputs(texts=texts), **fields)


def unpack(response: pb.EmbedResponse) -> np.ndarray:
    return np.stack([np.frombuffer(e.packed, dtype="<f4") for e in response.embeddings])


async def test_health(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", SERVICE_NAME):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_model_info(stub):
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.model_id == "all-minilm-l6-v2" and info.architecture == "BertModel"
    assert (info.dimension, info.max_input_tokens, info.vocab_size) == (384, 256, 30522)
    assert info.normalized and info.pooling == "mean"
    assert not info.supports_matryoshka and list(info.matryoshka_dimensions) == []
    assert info.max_inputs_per_request == 2048


async def test_packed_and_float_encodings_carry_the_same_vectors(stub, embedder):
    texts = ["Hello world", "A second, longer sentence about something else."]
    packed = await stub.Embed(texts_request(texts))
    floats = await stub.Embed(texts_request(texts, encoding=pb.VECTOR_ENCODING_FLOATS))
    assert packed.dimension == floats.dimension == 384
    as_floats = np.array([list(e.values) for e in floats.embeddings], dtype=np.float32)
    np.testing.assert_array_equal(unpack(packed), as_floats)
    assert all(not e.values for e in packed.embeddings)
    assert all(not e.packed for e in floats.embeddings)
    direct = embedder.embed([ids for ids, _ in embedder.tokenize(texts, truncate=False)])
    np.testing.assert_allclose(unpack(packed), direct, atol=1e-6)
    counts = [e.num_tokens for e in packed.embeddings]
    assert counts == [4, 11]
    assert packed.usage.prompt_tokens == packed.usage.total_tokens == sum(counts)
    assert packed.model_id == "all-minilm-l6-v2"


async def test_token_id_inputs(stub, embedder):
    ((ids, _),) = embedder.tokenize(["token ids in, vector out"], truncate=False)
    by_ids = await stub.Embed(
        pb.EmbedRequest(token_ids=pb.TokenInputs(inputs=[pb.TokenIds(ids=ids)]))
    )
    by_text = await stub.Embed(texts_request(["token ids in, vector out"]))
    np.testing.assert_allclose(unpack(by_ids), unpack(by_text), atol=1e-6)
    assert by_ids.usage.prompt_tokens == len(ids)


async def test_truncate_flag(stub):
    long_text = "many words " * 300
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.Embed(texts_request([long_text]))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    reply = await stub.Embed(texts_request([long_text], truncate=True))
    assert reply.embeddings[0].truncated and reply.embeddings[0].num_tokens == 256


@pytest.mark.parametrize(
    "request_, code, param",
    [
        (pb.EmbedRequest(), grpc.StatusCode.INVALID_ARGUMENT, "input"),
        (texts_request([]), grpc.StatusCode.INVALID_ARGUMENT, "input"),
        (texts_request(["a", ""]), grpc.StatusCode.INVALID_ARGUMENT, "input"),
        (texts_request(["a"], dimensions=8), grpc.StatusCode.INVALID_ARGUMENT, "dimensions"),
        (texts_request(["a"], dimensions=0), grpc.StatusCode.INVALID_ARGUMENT, "dimensions"),
        (
            pb.EmbedRequest(token_ids=pb.TokenInputs(inputs=[pb.TokenIds(ids=[99999])])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "input",
        ),
        (texts_request(["a"], model="other"), grpc.StatusCode.NOT_FOUND, "model"),
    ],
)
async def test_bad_requests_name_the_field(stub, request_, code, param):
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.Embed(request_)
    assert exc.value.code() == code
    error = api_error_from_grpc(exc.value.code(), exc.value.details())
    assert error.param == param and error.status in (400, 404)


@pytest.mark.parametrize("batcher_config", [{"max_queued_inputs": 2}])
async def test_overload_is_resource_exhausted(stub):
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.Embed(texts_request(["a", "b", "c"]))
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert api_error_from_grpc(exc.value.code(), exc.value.details()).status == 429


@pytest.mark.parametrize("batcher_config", [{"max_wait_ms": 20}])
async def test_concurrent_calls_are_batched_and_match_solo(stub):
    texts = [f"concurrent request {i} " + "padding words " * (i % 7) for i in range(24)]
    solo = [unpack(await stub.Embed(texts_request([t])))[0] for t in texts[:4]]
    before = await stub.GetStats(pb.GetStatsRequest())
    replies = await asyncio.gather(*(stub.Embed(texts_request([t])) for t in texts))
    after = await stub.GetStats(pb.GetStatsRequest())
    got = np.stack([unpack(r)[0] for r in replies])
    np.testing.assert_allclose(got[:4], np.stack(solo), atol=1e-5)
    assert after.requests_total - before.requests_total == 24
    assert after.inputs_total - before.inputs_total == 24
    assert after.batches_total - before.batches_total < 24
    assert after.queued_inputs == 0


async def test_deadline_exceeded_call_does_not_break_the_server(stub):
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.Embed(texts_request(["word " * 200] * 64), timeout=0.001)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    reply = await stub.Embed(texts_request(["still alive"]))
    assert reply.dimension == 384
