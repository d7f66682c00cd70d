"""Fixtures of the gateway tests.

- ``client``: a gateway app driven in-process (httpx ASGI transport, lifespan running)
  whose only engine address is dead: for everything decided before an engine call.
- ``make_client(settings or app)`` / ``make_settings(...)`` / ``serve(settings)``: the
  same for custom settings (or an app made from them, to look at its state), or served by
  a real uvicorn on a free loopback port.
- ``start_service(servicer, add_to_server, service)``: any gRPC test double on a free
  loopback port, beside a health service that reports ``service`` SERVING;
- ``engine`` / ``make_engine()``: a :class:`RecordingEngine` served that way (the
  embeddings and ASR doubles are ``routes/conftest.py``'s).

The recording engine is not a model. Each test scripts the exact messages it answers with
(or an error, or a hang), so assertions are about the gateway's translation: the request
the engine received, the HTTP/SSE framing built from known messages, and whether the call
was cancelled when the HTTP client went away.

Test modules import nothing from here (conftest.py names repeat across the repository);
everything is reached through fixtures.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from jacana_common.errors import grpc_details
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_common.pb.jacana.engine.v1 import engine_pb2_grpc
from jacana_gateway.app import create_app
from jacana_gateway.backends.engine import ENGINE_SERVICE
from jacana_gateway.settings import GatewaySettings

MODEL = "test-model"


def _dead_address() -> str:
    """A loopback address where nothing listens (the port is released before use)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _settings(engines: dict[str, list[str]] | None = None, **overrides) -> GatewaySettings:
    return GatewaySettings(engines=engines or {MODEL: [_dead_address()]}, **overrides)


@asynccontextmanager
async def _asgi_client(config: GatewaySettings | FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the gateway app for ``config`` (or of that app itself), lifespan running."""
    app = config if isinstance(config, FastAPI) else create_app(config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield client


@asynccontextmanager
async def _uvicorn(config: GatewaySettings) -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), log_config=None, lifespan="on", log_level="warning")
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


@dataclass
class Script:
    """What the recording engine answers: messages (``pause_s`` before each), then
    optionally an error ``(code, message, param)``; ``hang`` keeps the call open after the
    messages until the client cancels it."""

    messages: list[pb.GenerateResponse] = field(default_factory=list)
    pause_s: float = 0.0
    error: tuple[grpc.StatusCode, str, str | None] | None = None
    hang: bool = False


class RecordingEngine(engine_pb2_grpc.EngineServicer):
    """Records every GenerateRequest and whether each call completed or was cancelled."""

    def __init__(self) -> None:
        self.script = Script()
        self.requests: list[pb.GenerateRequest] = []
        self.completed: list[str] = []
        self.cancelled: list[str] = []
        self.started = asyncio.Event()
        self.cancelled_event = asyncio.Event()

    async def Generate(self, request, context):
        self.requests.append(request)
        self.started.set()
        script = self.script
        try:
            for message in script.messages:
                if script.pause_s:
                    await asyncio.sleep(script.pause_s)
                yield message
            if script.hang:
                await asyncio.Event().wait()
            if script.error is not None:
                code, message, param = script.error
                await context.abort(code, grpc_details(message, param))
            self.completed.append(request.request_id)
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            self.cancelled_event.set()
            raise


@dataclass
class RunningService:
    """A test double served on a loopback port, with the health service beside it."""

    servicer: Any
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    address: str
    service: str  # the name its health service reports on

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse
        await self.health.set(self.service, status.SERVING if serving else status.NOT_SERVING)


@pytest.fixture
def model() -> str:
    return MODEL


@pytest.fixture
def dead_address() -> Callable[[], str]:
    return _dead_address


@pytest.fixture
def make_settings() -> Callable[..., GatewaySettings]:
    return _settings


@pytest.fixture
def make_client():
    return _asgi_client


@pytest.fixture
def serve():
    return _uvicorn


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with _asgi_client(_settings()) as c:
        yield c


@pytest.fixture
def script() -> type[Script]:
    return Script


@pytest.fixture
async def start_service() -> AsyncIterator[Callable[..., Awaitable[RunningService]]]:
    """``await start_service(servicer, add_to_server, service)``: serve a test double on a
    free loopback port, SERVING; all are stopped after the test."""
    running: list[RunningService] = []

    async def start(servicer: Any, add_to_server: Callable, service: str) -> RunningService:
        server = grpc.aio.server()
        add_to_server(servicer, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        running.append(
            RunningService(servicer, server, health_servicer, f"127.0.0.1:{port}", service)
        )
        await running[-1].set_serving(True)
        return running[-1]

    yield start
    for r in running:
        await r.server.stop(0)


@pytest.fixture
def make_engine(start_service) -> Callable[[], Awaitable[RunningService]]:
    """Start recording engines on demand; all are stopped after the test."""

    async def start() -> RunningService:
        add = engine_pb2_grpc.add_EngineServicer_to_server
        return await start_service(RecordingEngine(), add, ENGINE_SERVICE)

    return start


@pytest.fixture
async def engine(make_engine) -> RunningService:
    return await make_engine()
