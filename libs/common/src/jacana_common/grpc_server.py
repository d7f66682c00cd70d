"""gRPC server factory: asyncio server with grpc.health.v1, reflection and a graceful stop.

Usage from a service's ``__main__``::

    server = GrpcServer("jacana.engine.v1.Engine", settings)
    engine_pb2_grpc.add_EngineServicer_to_server(servicer, server.server)
    await server.run(on_stop=engine.shutdown)   # returns after SIGTERM/SIGINT

On SIGTERM the health status flips to NOT_SERVING (so balancers stop sending), in-flight
calls get ``shutdown_grace_s`` to finish, then the server stops and ``on_stop`` runs.

Metrics: the server owns the service's Prometheus registry (``server.registry``, with
the process's ``jacana_process_*`` metrics and every call counted by method and status,
:mod:`jacana_common.grpc_metrics`; the service registers its own there) and,
when the settings carry a non-zero ``metrics_port``
(:class:`~jacana_common.metrics.MetricsSettings`), serves it on that port from
:meth:`GrpcServer.start` until :meth:`GrpcServer.stop`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, ProcessCollector

from jacana_common.grpc_client import KEEPALIVE_TIME_MS, MAX_MESSAGE_BYTES
from jacana_common.grpc_metrics import GrpcMetricsInterceptor
from jacana_common.metrics import MetricsExporter, MetricsSettings
from jacana_common.settings import ServiceSettings

log = logging.getLogger(__name__)


# Accept the keepalive pings of our own clients (every KEEPALIVE_TIME_MS, also on idle
# connections): by default a server allows one ping per 5 minutes without calls and
# answers more with GOAWAY "too_many_pings", dropping the connection.
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
]


class GrpcServer:
    """One grpc.aio server for one service name, plus health and reflection."""

    def __init__(self, service_name: str, settings: ServiceSettings) -> None:
        self.service_name = service_name
        self.settings = settings
        self.registry = CollectorRegistry()
        ProcessCollector(namespace="jacana", registry=self.registry)  # RSS, CPU, open files
        self.server = grpc.aio.server(
            options=SERVER_OPTIONS, interceptors=[GrpcMetricsInterceptor(self.registry)]
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port: int | None = None
        self.metrics: MetricsExporter | None = None
        self._stop = asyncio.Event()

    async def start(self) -> int:
        """Bind, start serving and mark the service SERVING; return the bound port."""
        reflection.enable_server_reflection(
            (self.service_name, reflection.SERVICE_NAME, health.SERVICE_NAME), self.server
        )
        self.port = self.server.add_insecure_port(f"{self.settings.host}:{self.settings.port}")
        if self.port == 0:
            raise OSError(f"cannot bind {self.settings.host}:{self.settings.port}")
        await self.server.start()
        for name in ("", self.service_name):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("%s listening on %s:%d", self.service_name, self.settings.host, self.port)
        if isinstance(self.settings, MetricsSettings) and self.settings.metrics_port:
            self.metrics = MetricsExporter(
                self.registry, self.settings.host, self.settings.metrics_port
            )
            log.info("metrics on http://%s:%d/metrics", self.settings.host, self.metrics.port)
        return self.port

    def request_stop(self) -> None:
        """Ask :meth:`run` to shut down (what SIGTERM does)."""
        self._stop.set()

    async def stop(self) -> None:
        for name in ("", self.service_name):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(self.settings.shutdown_grace_s)
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.stop)
            self.metrics = None

    async def run(self, on_stop: Callable[[], Awaitable[None] | None] | None = None) -> None:
        """Serve until SIGTERM/SIGINT (or :meth:`request_stop`), then stop gracefully."""
        if self.port is None:
            await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        await self._stop.wait()
        log.info("stopping %s (grace %.1fs)", self.service_name, self.settings.shutdown_grace_s)
        await self.stop()
        if on_stop is not None:
            result = on_stop()
            if asyncio.iscoroutine(result):
                await result
