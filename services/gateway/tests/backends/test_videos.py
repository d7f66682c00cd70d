"""The multimodal backends: routing by model and by video id, the errors the client sees
(429 with Retry-After from the trailing metadata), and the model card cache."""

from __future__ import annotations

import grpc
import pytest

from jacana_common.errors import grpc_details
from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2 as pb
from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2_grpc
from jacana_gateway.backends.videos import (
    ANY_REPLICA,
    CARD_TTL_S,
    MULTIMODAL_SERVICE,
    RETRY_CARD_S,
    VideoBackends,
    retry_after,
    video_error,
)
from jacana_gateway.errors import ApiErrorWithHeaders


def rpc_error(code: grpc.StatusCode, details: str = "", trailing=()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details=details
    )


@pytest.mark.parametrize(
    "trailing, seconds",
    [
        ((("retry-after", "7"),), 7),
        ((("retry-after", "2.5"),), 3),
        ((("retry-after", "0"),), 0),
        ((("retry-after", "-4"),), 0),
        ((("retry-after", "soon"),), 1),
        ((("retry-after", "inf"),), 1),
        ((("other", "9"),), 1),
        ((), 1),
    ],
)
def test_retry_after_reads_the_trailing_metadata(trailing, seconds):
    assert retry_after(rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "", trailing)) == seconds


def test_errors_as_the_client_sees_them():
    full = video_error(
        rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", (("retry-after", "12"),))
    )
    assert isinstance(full, ApiErrorWithHeaders)
    assert (full.status, full.message, full.headers) == (429, "queue full", {"Retry-After": "12"})
    details = grpc_details("video v is queued", None, "video_not_ready")
    not_ready = video_error(rpc_error(grpc.StatusCode.FAILED_PRECONDITION, details))
    assert (not_ready.status, not_ready.code, not_ready.message) == (
        400,
        "video_not_ready",
        "video v is queued",
    )
    missing = video_error(rpc_error(grpc.StatusCode.NOT_FOUND, grpc_details("gone", "video_id")))
    assert (missing.status, missing.param) == (404, "video_id")
    down = video_error(rpc_error(grpc.StatusCode.UNAVAILABLE, "failed to connect to 10.1.2.3:9"))
    assert down.status == 503 and "10.1.2.3" not in down.message


async def test_calls_by_id_may_go_to_any_replica_of_any_model():
    backends = VideoBackends({"a": ["h:1", "h:2"], "b": ["h:2", "h:3"]})
    await backends.start()
    try:
        assert backends.models == ["a", "b"]
        assert "a" in backends and ANY_REPLICA not in backends
        anyone = [r.target for r in backends.pool.replicas(ANY_REPLICA)]
        assert anyone == ["h:1", "h:2", "h:3"]
        channels = {r.target: r.channel for r in backends.pool.replicas("a")}
        assert all(r.channel is channels[r.target] for r in backends.pool.replicas(ANY_REPLICA)[:2])
        report = await backends.health(timeout=0.2)
        assert set(report) == {"a", "b"}
    finally:
        await backends.close()
    assert VideoBackends({}).models == []


class CountingCards(multimodal_pb2_grpc.MultimodalServicer):
    def __init__(self) -> None:
        self.calls = 0
        self.cards = [pb.ModelCard(id="wan", random_weights=True, description="d")]

    async def ListModels(self, request, context):
        self.calls += 1
        return pb.ListModelsResponse(models=self.cards)


async def test_model_cards_are_cached_and_failures_retried_sooner(start_service, dead_address):
    service = await start_service(
        CountingCards(), multimodal_pb2_grpc.add_MultimodalServicer_to_server, MULTIMODAL_SERVICE
    )
    now = [0.0]
    backends = VideoBackends(
        {"wan": [service.address], "down": [dead_address()]}, clock=lambda: now[0]
    )
    await backends.start()
    try:
        cards = await backends.model_cards(timeout=2.0)
        assert cards["wan"].random_weights and cards["down"] is None
        now[0] += RETRY_CARD_S + 0.1  # the failure is retried, the card kept
        assert (await backends.model_cards(timeout=2.0))["wan"].description == "d"
        assert service.servicer.calls == 1
        now[0] += CARD_TTL_S
        service.servicer.cards = []  # the service no longer offers it
        assert (await backends.model_cards(timeout=2.0))["wan"] is None
        assert service.servicer.calls == 2
    finally:
        await backends.close()
