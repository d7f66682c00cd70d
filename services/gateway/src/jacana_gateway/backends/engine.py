"""One streaming Generate call to an engine replica, from first message to cancellation.

:func:`open_stream` picks a replica, starts the call with a deadline and waits for the
first message, so that failures the engine reports up front (a prompt too long for the
context, an engine that is down) become proper HTTP errors before any response byte is
sent. Only while no message has arrived, an UNAVAILABLE replica is skipped for the next
candidate. The returned :class:`EngineStream` owns the call: :meth:`EngineStream.close`
cancels it (the engine then aborts the request) and is safe to call more than once; the
caller must close it on every path, disconnects included.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc

from jacana_common.errors import ApiError, api_error_from_grpc
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_common.pb.jacana.engine.v1 import engine_pb2_grpc
from jacana_common.telemetry import outgoing_metadata
from jacana_gateway.backends.replica_pool import Replica, ReplicaPool
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


class EngineStream:
    """An open Generate call whose first message has already been received."""

    def __init__(
        self, pool: ReplicaPool, replica: Replica, call: grpc.aio.UnaryStreamCall, first
    ) -> None:
        self.replica = replica
        self._pool = pool
        self._call = call
        self._first: pb.GenerateResponse | None = first
        self._closed = False

    async def messages(self) -> AsyncIterator[pb.GenerateResponse]:
        """Every message until the engine ends the stream; engine failures raise ApiError."""
        try:
            if self._first is not None:
                first, self._first = self._first, None
                yield first
            while True:
                try:
                    message = await self._call.read()
                except grpc.aio.AioRpcError as exc:
                    raise _error(exc, self.replica) from None
                if message is grpc.aio.EOF:
                    return
                yield message
        finally:
            self.close()

    def close(self) -> None:
        """Cancel the call if it is still running and stop counting it as in flight."""
        if self._closed:
            return
        self._closed = True
        self._call.cancel()
        self._pool.release(self.replica)


async def open_stream(
    pool: ReplicaPool, model: str, request: pb.GenerateRequest, timeout_s: float
) -> EngineStream:
    """Start ``request`` on the best replica of ``model``; raise ApiError if none takes it."""
    candidates = pool.candidates(model)
    for attempt, replica in enumerate(candidates):
        pool.acquire(replica)
        call = replica.stub.Generate(request, timeout=timeout_s, metadata=outgoing_metadata())
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            pool.release(replica)
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                pool.mark_failed(replica)
                if attempt + 1 < len(candidates):
                    continue
            raise _error(exc, replica) from None
        except BaseException:
            call.cancel()
            pool.release(replica)
            raise
        if first is grpc.aio.EOF:
            pool.release(replica)
            raise _ended_early()
        return EngineStream(pool, replica, call, first)
    raise AssertionError("a model always has at least one replica")
