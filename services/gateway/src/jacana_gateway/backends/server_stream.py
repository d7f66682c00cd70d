"""One server-streaming gRPC call on a replica, from first message to cancellation: the
engine's ``Generate`` and the ASR service's ``TranscribeStream`` go through it.

:func:`open_server_stream` picks a replica, starts the call with a deadline and waits for
the first message, so that failures the service reports up front (a prompt too long, audio
that does not decode, a service that is down) become proper HTTP errors before any response
byte is sent. Only while no message has arrived, an UNAVAILABLE replica is skipped for the
next candidate. The returned :class:`ServerStream` owns the call and the replica's
in-flight count: :meth:`ServerStream.close` cancels the call (the service then stops the
work) and is safe to call more than once; the caller must close it on every path,
disconnects included.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from jacana_common.errors import ApiError
from jacana_common.telemetry import outgoing_metadata
from jacana_gateway.backends.replica_pool import Replica, ReplicaPool

# A failed call as the client sees it; the replica is named for the log.
ToError = Callable[[grpc.aio.AioRpcError, Replica], ApiError]


class ServerStream:
    """An open server-streaming call whose first message has already been received."""

    def __init__(
        self,
        pool: ReplicaPool,
        replica: Replica,
        call: grpc.aio.UnaryStreamCall,
        first: Any,
        to_error: ToError,
    ) -> None:
        self.replica = replica
        self.first = first  # the first message, kept for callers that read its header
        self._pool = pool
        self._call = call
        self._first = first
        self._to_error = to_error
        self._closed = False

    async def messages(self) -> AsyncIterator[Any]:
        """Every message until the service ends the stream; failures raise ApiError."""
        try:
            if self._first is not None:
                first, self._first = self._first, None
                yield first
            while True:
                try:
                    message = await self._call.read()
                except grpc.aio.AioRpcError as exc:
                    raise self._to_error(exc, self.replica) from None
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


async def open_server_stream(
    pool: ReplicaPool,
    model: str,
    method: str,
    request: Any,
    timeout_s: float,
    *,
    to_error: ToError,
    ended_early: Callable[[], Any],
) -> ServerStream:
    """Start ``replica.stub.<method>(request)`` on the best replica of ``model`` and wait
    for its first message; raise ``to_error``'s ApiError if no replica gives one.
    ``ended_early()`` says what a stream that ends without any message means: an ApiError
    (raised), or a message that stands for the first (an empty artifact)."""
    candidates = pool.candidates(model)
    for attempt, replica in enumerate(candidates):
        pool.acquire(replica)
        start = getattr(replica.stub, method)
        call = start(request, timeout=timeout_s, metadata=outgoing_metadata())
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            pool.release(replica)
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                pool.mark_failed(replica)
                if attempt + 1 < len(candidates):
                    continue
            raise to_error(exc, replica) from None
        except BaseException:
            call.cancel()
            pool.release(replica)
            raise
        if first is grpc.aio.EOF:
            first = ended_early()
            if isinstance(first, ApiError):
                pool.release(replica)
                raise first
        return ServerStream(pool, replica, call, first, to_error)
    raise AssertionError("a model always has at least one replica")
