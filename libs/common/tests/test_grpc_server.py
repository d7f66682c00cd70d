"""The server factory serves health + reflection over real gRPC and stops gracefully."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from jacana_common.grpc_client import check_health, make_channel
from jacana_common.grpc_server import GrpcServer
from jacana_common.settings import ServiceSettings


async def test_health_reflection_and_graceful_stop():
    server = GrpcServer("jacana.test.v1.Nothing", ServiceSettings(port=0, shutdown_grace_s=1))
    port = await server.start()
    target = f"127.0.0.1:{port}"
    run = asyncio.create_task(server.run())
    try:
        assert await check_health(target)
        assert await check_health(target, "jacana.test.v1.Nothing")
        async with make_channel(target) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)

            async def one_request():
                yield reflection_pb2.ServerReflectionRequest(list_services="")

            names = []
            async for resp in stub.ServerReflectionInfo(one_request()):
                names = [s.name for s in resp.list_services_response.service]
            assert "jacana.test.v1.Nothing" in names
            assert "grpc.health.v1.Health" in names
    finally:
        server.request_stop()
        await asyncio.wait_for(run, 10)
    # Stopped: health checks now fail instead of hanging.
    assert not await check_health(target, timeout=1.0)


async def test_unknown_service_is_not_serving():
    server = GrpcServer("jacana.test.v1.Nothing", ServiceSettings(port=0))
    port = await server.start()
    try:
        async with make_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                await stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=2)
                raise AssertionError("unknown service reported healthy")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop()


def test_servers_accept_the_keepalive_pings_of_idle_clients():
    from jacana_common.grpc_client import CHANNEL_OPTIONS, KEEPALIVE_TIME_MS
    from jacana_common.grpc_server import SERVER_OPTIONS

    client, server = dict(CHANNEL_OPTIONS), dict(SERVER_OPTIONS)
    assert client["grpc.keepalive_time_ms"] == KEEPALIVE_TIME_MS
    assert client["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.http2.min_ping_interval_without_data_ms"] < KEEPALIVE_TIME_MS


@pytest.mark.slow
async def test_an_idle_connection_outlives_three_keepalive_pings():
    """Without the server's ping policy it answers the third idle ping (~30 s) with
    GOAWAY "too_many_pings" and the connection drops."""
    from jacana_common.grpc_client import KEEPALIVE_TIME_MS

    server = GrpcServer("jacana.test.v1.Nothing", ServiceSettings(port=0, shutdown_grace_s=1))
    port = await server.start()
    run = asyncio.create_task(server.run())
    try:
        async with make_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
            deadline = asyncio.get_running_loop().time() + 3.5 * KEEPALIVE_TIME_MS / 1000
            while asyncio.get_running_loop().time() < deadline:
                assert channel.get_state() is grpc.ChannelConnectivity.READY
                await asyncio.sleep(0.5)
    finally:
        server.request_stop()
        await asyncio.wait_for(run, 10)
