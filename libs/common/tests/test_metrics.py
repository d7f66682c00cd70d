"""The shared metrics: a gRPC server's metrics port over real HTTP, its calls counted by
method and status over real gRPC, the request timer's observations, and the names a
registry exports."""

from __future__ import annotations

import socket
import time

import grpc
import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from jacana_common.grpc_client import make_channel
from jacana_common.grpc_server import GrpcServer
from jacana_common.metrics import LatencyHistograms, MetricsSettings, RequestTimer, exported_names
from jacana_common.settings import ServiceSettings


class _Settings(ServiceSettings, MetricsSettings):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _value(text: str, sample: str) -> float:
    """The value of the exposition line that starts with ``sample``."""
    lines = [line for line in text.splitlines() if line.startswith(sample + " ")]
    assert len(lines) == 1, (sample, text)
    return float(lines[0].rsplit(" ", 1)[1])


async def test_the_metrics_port_serves_the_servers_registry_until_it_stops():
    port = _free_port()
    server = GrpcServer("jacana.test.v1.Nothing", _Settings(port=0, metrics_port=port))
    Counter("jacana_test_things", "Things.", registry=server.registry).inc(3)
    await server.start()
    try:
        reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert reply.status_code == 200
        assert _value(reply.text, "jacana_test_things_total") == 3.0
    finally:
        await server.stop()
    try:
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        raise AssertionError("metrics still served after stop")
    except httpx.TransportError:
        pass


async def test_metrics_port_zero_serves_nothing():
    server = GrpcServer("jacana.test.v1.Nothing", _Settings(port=0))
    await server.start()
    try:
        assert server.metrics is None
    finally:
        await server.stop()


def test_request_timer_observes_first_token_per_token_and_total_time():
    registry = CollectorRegistry()
    histograms = LatencyHistograms.register(registry, "jacana_test", ("model",))
    timer = RequestTimer(histograms, ("m",))
    time.sleep(0.02)
    timer.tokens(0, 1)
    for _ in range(4):  # choice 0 reaches 5 tokens, choice 1 only 2
        time.sleep(0.01)
        timer.tokens(0, 1)
    timer.tokens(1, 2)
    timer.finish()

    def get(name: str) -> float:
        return registry.get_sample_value(name, {"model": "m"})

    assert get("jacana_test_time_to_first_token_seconds_count") == 1
    assert 0.02 <= get("jacana_test_time_to_first_token_seconds_sum") < 1
    assert get("jacana_test_time_per_output_token_seconds_count") == 1
    # 4 gaps of the longest choice after its first token
    assert 0.01 <= get("jacana_test_time_per_output_token_seconds_sum") < 0.25
    e2e = get("jacana_test_e2e_request_latency_seconds_sum")
    assert e2e >= 0.06 and get("jacana_test_e2e_request_latency_seconds_count") == 1


def test_a_single_token_request_has_no_time_per_output_token():
    registry = CollectorRegistry()
    timer = RequestTimer(LatencyHistograms.register(registry, "jacana_test"))
    timer.tokens(0, 1)
    timer.finish()
    assert registry.get_sample_value("jacana_test_time_per_output_token_seconds_count") == 0
    assert registry.get_sample_value("jacana_test_e2e_request_latency_seconds_count") == 1


def test_exported_names_cover_families_without_samples_yet():
    registry = CollectorRegistry()
    Counter("jacana_test_a", "A.", ("x",), registry=registry)
    Histogram("jacana_test_b_seconds", "B.", ("x",), registry=registry)
    Gauge("jacana_test_c", "C.", registry=registry)
    names = exported_names([registry])
    assert {"jacana_test_a_total", "jacana_test_b_seconds_bucket", "jacana_test_c"} <= names
    assert {"jacana_test_b_seconds_sum", "jacana_test_b_seconds_count"} <= names
    assert "jacana_test_a" not in names  # a counter is only ever read as ..._total


async def _fail(request: bytes, context) -> bytes:
    raise RuntimeError("a bug")


async def _refuse(request: bytes, context) -> bytes:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad input")


async def _count(request: bytes, context):
    for i in range(3):
        yield bytes([i])


async def test_every_call_is_counted_by_method_and_code():
    server = GrpcServer("jacana.test.v1.Calls", _Settings(port=0))
    handlers = {
        "Fail": grpc.unary_unary_rpc_method_handler(_fail),
        "Refuse": grpc.unary_unary_rpc_method_handler(_refuse),
        "Count": grpc.unary_stream_rpc_method_handler(_count),
    }
    server.server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("jacana.test.v1.Calls", handlers),)
    )
    port = await server.start()
    try:
        async with make_channel(f"127.0.0.1:{port}") as channel:
            replies = [r async for r in channel.unary_stream("/jacana.test.v1.Calls/Count")(b"")]
            assert replies == [b"\x00", b"\x01", b"\x02"]
            for name, code in (("Fail", grpc.StatusCode.UNKNOWN), ("Refuse", "INVALID_ARGUMENT")):
                try:
                    await channel.unary_unary(f"/jacana.test.v1.Calls/{name}")(b"", timeout=5)
                    raise AssertionError(f"{name} succeeded")
                except grpc.aio.AioRpcError as exc:
                    assert exc.code().name == getattr(code, "name", code)
    finally:
        await server.stop()

    def get(name: str, **labels: str) -> float | None:
        return server.registry.get_sample_value(name, labels)

    handled = "jacana_grpc_server_handled_total"
    assert get(handled, method="/jacana.test.v1.Calls/Count", code="OK") == 1
    assert get(handled, method="/jacana.test.v1.Calls/Refuse", code="INVALID_ARGUMENT") == 1
    assert get(handled, method="/jacana.test.v1.Calls/Fail", code="UNKNOWN") == 1
    assert get("jacana_grpc_server_errors_total", method="/jacana.test.v1.Calls/Fail") == 1
    assert get("jacana_grpc_server_errors_total", method="/jacana.test.v1.Calls/Refuse") is None
    seconds = "jacana_grpc_server_handling_seconds_count"
    assert get(seconds, method="/jacana.test.v1.Calls/Count") == 1
