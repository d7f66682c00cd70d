"""scripts/healthcheck.py, the containers' probe, against real gRPC and HTTP servers."""

from __future__ import annotations

import asyncio
import http.server
import os
import sys
import threading
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from stack import free_port

PROBE = Path(__file__).resolve().parents[1] / "scripts" / "healthcheck.py"


async def probe(*args: str, env: dict[str, str] | None = None) -> int:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(PROBE), *args, env={**os.environ, **(env or {})}
    )
    return await asyncio.wait_for(proc.wait(), 30)


async def test_grpc_probe_follows_the_serving_status():
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert await probe("engine", env={"JACANA_ENGINE_PORT": str(port)}) == 0
        assert await probe("embeddings", env={"JACANA_EMBEDDINGS_PORT": str(port)}) == 0
        assert await probe("drafter", env={"JACANA_DRAFTER_PORT": str(port)}) == 0
        assert await probe("asr", env={"JACANA_ASR_PORT": str(port)}) == 0
        assert await probe("grpc", f"127.0.0.1:{port}") == 0
        await servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert await probe("engine", env={"JACANA_ENGINE_PORT": str(port)}) == 1
        assert await probe("embeddings", env={"JACANA_EMBEDDINGS_PORT": str(port)}) == 1
        assert await probe("drafter", env={"JACANA_DRAFTER_PORT": str(port)}) == 1
        assert await probe("asr", env={"JACANA_ASR_PORT": str(port)}) == 1
    finally:
        await server.stop(None)
    assert await probe("grpc", f"127.0.0.1:{port}") == 1


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


async def test_http_probe_needs_a_200_from_health():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert await probe("gateway", env={"JACANA_GATEWAY_PORT": str(port)}) == 0
        _Health.status = 503
        assert await probe("gateway", env={"JACANA_GATEWAY_PORT": str(port)}) == 1
        assert await probe("http", f"http://127.0.0.1:{port}/nope") == 1
    finally:
        _Health.status = 200
        server.shutdown()
        server.server_close()
    assert await probe("http", f"http://127.0.0.1:{free_port()}/health") == 1


async def test_usage_error():
    assert await probe() == 2
    assert await probe("redis") == 2
