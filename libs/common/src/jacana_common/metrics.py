"""Prometheus metrics shared by every service: the metrics port setting, the exporter, the
latency histograms of LLM serving and the timer that fills them.

Ownership: every process builds its own :class:`prometheus_client.CollectorRegistry`
(the gateway app in ``create_app``, a gRPC service in :class:`~jacana_common.grpc_server.
GrpcServer`) and registers its metrics there; nothing is registered in the library's
global registry, so importing a module registers nothing and two apps in one test
process never collide.

- :class:`MetricsSettings`: the ``metrics_port`` mixin of the gRPC services' settings
  (0, the default, is off; the gateway serves ``/metrics`` on its HTTP port instead).
- :class:`MetricsExporter`: ``/metrics`` of one registry on its own HTTP port, served by
  a daemon thread (prometheus_client's WSGI server), so a busy event loop or engine step
  never delays a scrape.
- :class:`LatencyHistograms` and :class:`RequestTimer`: time to first token, time per
  output token and end-to-end latency, measured one way in the gateway and the engine.

Names follow Prometheus conventions: ``jacana_<service>_<what>_<unit>``, seconds for
time, ``_total`` for counters (prometheus_client appends it to a Counter's name).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from pydantic import BaseModel, Field

# Buckets for LLM serving (seconds), as vLLM chooses them: a first token in a few ms on a
# warm GPU up to a minute behind a long queue; a decode step from 10 ms to seconds on a
# CPU; whole requests up to the gateway's default deadline of 600 s.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class MetricsSettings(BaseModel):
    """Metrics: the service's Prometheus endpoint. A mixin of each gRPC service's
    settings class, so the variable carries the service's prefix."""

    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="HTTP port of this service's Prometheus /metrics (on the service's "
        "host); 0 serves no metrics.",
    )


class MetricsExporter:
    """``registry`` served as ``GET /metrics`` on ``host:port`` until :meth:`stop`."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        server: WSGIServer
        server, thread = start_http_server(port, addr=host, registry=registry)
        self._server = server
        self._thread: threading.Thread = thread
        self.port: int = server.server_port

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@dataclass
class LatencyHistograms:
    """``<prefix>_time_to_first_token_seconds``, ``<prefix>_time_per_output_token_seconds``
    and ``<prefix>_e2e_request_latency_seconds``, labelled by ``labelnames``."""

    ttft: Histogram
    tpot: Histogram
    e2e: Histogram

    @classmethod
    def register(
        cls, registry: CollectorRegistry, prefix: str, labelnames: Sequence[str] = ()
    ) -> LatencyHistograms:
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                f"{prefix}_{name}", doc, labelnames, registry=registry, buckets=buckets
            )

        return cls(
            ttft=histogram(
                "time_to_first_token_seconds",
                "From the request's arrival to its first generated token.",
                TTFT_BUCKETS,
            ),
            tpot=histogram(
                "time_per_output_token_seconds",
                "Mean time between output tokens of a request after its first "
                "(one observation per request with at least two tokens).",
                TPOT_BUCKETS,
            ),
            e2e=histogram(
                "e2e_request_latency_seconds",
                "From the request's arrival to its last token (finished requests).",
                REQUEST_BUCKETS,
            ),
        )


@dataclass
class RequestTimer:
    """Times one generation request from ``started`` (``time.monotonic()``).

    Feed it each message's choice index and new token count with :meth:`tokens`, then
    call :meth:`finish` once the request completed; a request that failed or was
    cancelled is not observed (its latency would say nothing about serving). With
    several choices, time per output token follows the longest one.
    """

    histograms: LatencyHistograms
    labels: tuple[str, ...] = ()
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    _counts: dict[int, int] = field(default_factory=dict)

    def tokens(self, index: int, count: int) -> None:
        if count <= 0:
            return
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
            self._labelled(self.histograms.ttft).observe(self.first_token_at - self.started)
        self._counts[index] = self._counts.get(index, 0) + count

    def finish(self) -> None:
        now = time.monotonic()
        self._labelled(self.histograms.e2e).observe(now - self.started)
        longest = max(self._counts.values(), default=0)
        if self.first_token_at is not None and longest > 1:
            per_token = (now - self.first_token_at) / (longest - 1)
            self._labelled(self.histograms.tpot).observe(per_token)

    def _labelled(self, histogram: Histogram) -> Histogram:
        return histogram.labels(*self.labels) if self.labels else histogram


# The samples prometheus_client writes for a family of each type (a family with labels
# writes none until a first child exists, so names come from the type, not the samples).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


def exported_names(registries: Iterable[CollectorRegistry]) -> set[str]:
    """Every sample name the registries can export (``_total``, ``_bucket``, ``_sum``,
    ``_count``… included): the names a PromQL expression may use."""
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
            names.update(sample.name for sample in family.samples)
    return names
