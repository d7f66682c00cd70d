"""One streaming Generate call to an engine replica, from first message to cancellation.

:func:`open_stream` is :func:`jacana_gateway.backends.server_stream.open_server_stream`
for ``Generate``: failures the engine reports up front (a prompt too long for the context,
an engine that is down) become proper HTTP errors before any response byte is sent, and
an UNAVAILABLE replica is skipped while no message has arrived. The returned
:class:`EngineStream` owns the call: :meth:`EngineStream.close` cancels it (the engine
then aborts the request) and is safe to call more than once; the caller must close it on
every path, disconnects included.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from jacana_common.errors import ApiError, api_error_from_grpc
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_common.pb.jacana.engine.v1 import engine_pb2_grpc
from jacana_gateway.backends.replica_pool import Replica, ReplicaPool
from jacana_gateway.backends.server_stream import ServerStream, open_server_stream
from jacana_gateway.errors import engine_error, engine_unavailable

log = logging.getLogger(__name__)

ENGINE_SERVICE = "jacana.engine.v1.Engine"


def engine_pool(engines: Mapping[str, Sequence[str]], **options: Any) -> ReplicaPool:
    """The pool of engine replicas per model (``replica.stub`` is an ``EngineStub``)."""
    return ReplicaPool(engines, service=ENGINE_SERVICE, stub=engine_pb2_grpc.EngineStub, **options)


def _error(exc: grpc.aio.AioRpcError, replica: Replica) -> ApiError:
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        # The details name internal addresses; they go to the log, not to the client.
        log.warning("engine %s unavailable: %s", replica.target, exc.details())
        return engine_unavailable("No engine for this model is reachable; retry later.")
    return api_error_from_grpc(exc.code(), exc.details())


def _ended_early() -> ApiError:
    return engine_error("The engine closed the stream before finishing.")


# An open Generate call whose first message has already been received.
EngineStream = ServerStream


async def open_stream(
    pool: ReplicaPool, model: str, request: pb.GenerateRequest, timeout_s: float
) -> EngineStream:
    """Start ``request`` on the best replica of ``model``; raise ApiError if none takes it."""
    return await open_server_stream(
        pool, model, "Generate", request, timeout_s, to_error=_error, ended_early=_ended_early
    )
