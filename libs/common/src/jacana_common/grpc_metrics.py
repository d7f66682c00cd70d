"""Every gRPC call a service answers, counted by method and status code.

:class:`GrpcMetricsInterceptor` is installed by :class:`~jacana_common.grpc_server.
GrpcServer` on every service, so each metrics port shows:

- ``jacana_grpc_server_handled_total{method, code}``: calls by full method name
  (``/jacana.engine.v1.Engine/Generate``) and the status they ended with (``OK``,
  ``INVALID_ARGUMENT``…; a client that went away is ``CANCELLED``);
- ``jacana_grpc_server_errors_total{method}``: calls that ended in an exception the
  service did not turn into a status (gRPC answers those ``UNKNOWN``): the bugs.
- ``jacana_grpc_server_handling_seconds{method}``: from the call's start to its end.

Streaming calls are counted when the stream ends, however it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

from jacana_common.metrics import TTFT_BUCKETS


class GrpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times the calls of one server into ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.handled = Counter(
            "jacana_grpc_server_handled",
            "gRPC calls answered, by method and status code.",
            ("method", "code"),
            registry=registry,
        )
        self.errors = Counter(
            "jacana_grpc_server_errors",
            "gRPC calls that ended in an unexpected exception (answered UNKNOWN).",
            ("method",),
            registry=registry,
        )
        self.seconds = Histogram(
            "jacana_grpc_server_handling_seconds",
            "From a gRPC call's start to its end.",
            ("method",),
            buckets=TTFT_BUCKETS,
            registry=registry,
        )

    def _done(self, method: str, started: float, context: Any, exc: BaseException | None) -> None:
        if exc is None or isinstance(exc, grpc.aio.AbortError):
            code = context.code() or grpc.StatusCode.OK
        elif isinstance(exc, asyncio.CancelledError | GeneratorExit):
            code = grpc.StatusCode.CANCELLED
        else:
            code = grpc.StatusCode.UNKNOWN
            self.errors.labels(method).inc()
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        self.handled.labels(method, name).inc()
        self.seconds.labels(method).observe(time.monotonic() - started)

    def _unary(self, method: str, behavior: Callable[..., Awaitable[Any]]):
        async def call(request_or_iterator: Any, context: Any) -> Any:
            started = time.monotonic()
            try:
                reply = await behavior(request_or_iterator, context)
            except BaseException as exc:
                self._done(method, started, context, exc)
                raise
            self._done(method, started, context, None)
            return reply

        return call

    def _stream(self, method: str, behavior: Callable[..., AsyncGenerator[Any, None]]):
        async def call(request_or_iterator: Any, context: Any) -> AsyncIterator[Any]:
            started = time.monotonic()
            replies = behavior(request_or_iterator, context)
            try:
                async for reply in replies:
                    yield reply
            except BaseException as exc:
                self._done(method, started, context, exc)
                raise
            finally:
                # closed at once, as without the interceptor: the engine frees a cancelled
                # request's KV blocks when its stream closes, not when it is collected
                await replies.aclose()
            self._done(method, started, context, None)

        return call

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        codec = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary), **codec
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(method, handler.stream_unary), **codec
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream), **codec
            )
        return grpc.stream_stream_rpc_method_handler(
            self._stream(method, handler.stream_stream), **codec
        )
