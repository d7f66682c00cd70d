"""gRPC channel factory shared by every caller of a Jacana service.

Channels are asyncio channels with keepalive (a dead peer is noticed within seconds, not
at the next TCP timeout) and the same message size limit as the servers. Deadlines are
per call: pass ``timeout=`` to each stub call; :data:`DEFAULT_UNARY_TIMEOUT_S` is the
default for short unary calls.
"""

from __future__ import annotations

import grpc

DEFAULT_UNARY_TIMEOUT_S = 5.0
# 64 MiB: large prompts (token id lists) and embeddings batches fit. Servers use it too.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Clients ping an idle connection this often; servers must accept that (grpc_server.py).
KEEPALIVE_TIME_MS = 10_000
# Options of every client channel, asyncio or blocking.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect quickly after a backend restart instead of backing off for minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


def make_channel(target: str) -> grpc.aio.Channel:
    """An insecure asyncio channel to ``host:port``; connection is lazy."""
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


async def check_health(target: str, service: str = "", timeout: float = 2.0) -> bool:
    """True when the server at ``target`` reports SERVING for ``service``."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with make_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return resp.status == health_pb2.HealthCheckResponse.SERVING
