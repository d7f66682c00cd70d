"""The gateway's Prometheus metrics, one :class:`GatewayMetrics` per app, served as
``GET /metrics`` on the gateway's own HTTP port (:mod:`jacana_gateway.routes.ops`).

- ``jacana_gateway_requests_total{route, model, status}``: every HTTP request once it is
  answered (``route`` is the route's path template, ``other`` for unknown paths; ``model``
  the served model the request named, empty before a model was resolved);
- ``jacana_gateway_errors_total{route}``: requests that ended in an unexpected exception
  (they are answered 500 and also counted with status 500 above);
- ``jacana_gateway_request_duration_seconds{route, status}``: until the response's last
  byte (a stream included);
- ``jacana_gateway_time_to_first_token_seconds{model}``, ``…_time_per_output_token_seconds``
  and ``…_e2e_request_latency_seconds``: generation requests, from the handler's start
  (:class:`~jacana_common.metrics.RequestTimer`);
- ``jacana_gateway_prompt_tokens_total{model}`` / ``…_generation_tokens_total{model}``:
  from the engine's usage of completed requests (a prompt once, every choice's output);
- ``jacana_gateway_requests_in_flight``: requests admitted and not yet answered;
- ``jacana_process_*``: the process's memory, CPU and open files.

The middleware that counts requests is :mod:`jacana_gateway.middleware.metrics`; the
generation routes time their streams with :meth:`GatewayMetrics.timed`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from jacana_common.metrics import TTFT_BUCKETS, LatencyHistograms, RequestTimer
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_gateway.backends.engine import EngineStream

PREFIX = "jacana_gateway"


class GatewayMetrics:
    """The metrics of one gateway app, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(namespace="jacana", registry=r)  # as every service's port has
        self.requests = Counter(
            f"{PREFIX}_requests",
            "HTTP requests answered, by route template, model and status code.",
            ("route", "model", "status"),
            registry=r,
        )
        self.errors = Counter(
            f"{PREFIX}_errors",
            "Requests that ended in an unexpected exception (answered 500).",
            ("route",),
            registry=r,
        )
        self.duration = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "From the request's arrival to the response's last byte.",
            ("route", "status"),
            buckets=TTFT_BUCKETS,  # 1 ms (a /health) to minutes (a long stream)
            registry=r,
        )
        self.in_flight = Gauge(
            f"{PREFIX}_requests_in_flight", "HTTP requests not answered yet.", registry=r
        )
        self.latency = LatencyHistograms.register(r, PREFIX, ("model",))
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens",
            "Prompt tokens of completed requests.",
            ("model",),
            registry=r,
        )
        self.generation_tokens = Counter(
            f"{PREFIX}_generation_tokens",
            "Generated tokens of completed requests (every choice).",
            ("model",),
            registry=r,
        )

    def timed(self, stream: EngineStream, model: str, timer: RequestTimer) -> TimedStream:
        """``stream``, observed by ``timer`` (labelled ``model``) as its messages pass."""
        return TimedStream(stream, self, model, timer)


class TimedStream:
    """An :class:`EngineStream` whose messages feed the latency and token metrics; a
    request is observed once its stream ended normally (not failed, not cancelled)."""

    def __init__(
        self, stream: EngineStream, metrics: GatewayMetrics, model: str, timer: RequestTimer
    ) -> None:
        self._stream = stream
        self._metrics = metrics
        self._model = model
        self._timer = timer

    async def messages(self) -> AsyncIterator[pb.GenerateResponse]:
        prompt = generated = 0
        async for message in self._stream.messages():
            self._timer.tokens(message.index, len(message.token_ids))
            if message.HasField("usage"):
                prompt = message.usage.prompt_tokens  # one prompt, whatever the choices
                generated += message.usage.completion_tokens
            yield message
        self._timer.finish()
        self._metrics.prompt_tokens.labels(self._model).inc(prompt)
        self._metrics.generation_tokens.labels(self._model).inc(generated)

    def close(self) -> None:
        self._stream.close()
