"""The embeddings service's Prometheus metrics, served on ``JACANA_EMBEDDINGS_METRICS_PORT``.

- ``jacana_embeddings_batch_size`` / ``jacana_embeddings_batch_tokens``: inputs and real
  tokens of each forward pass, observed by the batcher's ``on_batch`` hook (the only
  per-batch numbers; the batcher's own stats are totals);
- the batcher's totals, read from :meth:`DynamicBatcher.stats` at scrape time
  (``jacana_embeddings_requests_total``, ``…_inputs_total``, ``…_tokens_total``,
  ``…_padded_tokens_total``, ``…_forward_seconds_total``) and the inputs queued now
  (``jacana_embeddings_queued_inputs``).

Every family carries the served ``model`` label.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jacana_embeddings.batcher import DynamicBatcher

PREFIX = "jacana_embeddings"
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class _BatcherCollector(Collector):
    def __init__(self, batcher: DynamicBatcher, model: str) -> None:
        self._batcher = batcher
        self._model = model

    def collect(self) -> Iterator[Metric]:
        s = self._batcher.stats()
        queued = GaugeMetricFamily(
            f"{PREFIX}_queued_inputs", "Inputs waiting for a forward pass.", labels=["model"]
        )
        queued.add_metric([self._model], s.queued_inputs)
        yield queued
        for name, doc, value in (
            ("requests", "Embedding requests batched.", s.requests_total),
            ("inputs", "Inputs embedded.", s.inputs_total),
            ("tokens", "Real tokens embedded.", s.tokens_total),
            ("padded_tokens", "Tokens computed, padding included.", s.padded_tokens_total),
            ("forward_seconds", "Wall time of the forward passes.", s.forward_s_total),
        ):
            family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["model"])
            family.add_metric([self._model], value)
            yield family


class EmbeddingsMetrics:
    """Registers the service's metrics in ``registry`` and hooks ``batcher``'s passes."""

    def __init__(self, registry: CollectorRegistry, batcher: DynamicBatcher, model: str) -> None:
        self.batch_size = Histogram(
            f"{PREFIX}_batch_size",
            "Inputs per forward pass.",
            ("model",),
            buckets=SIZE_BUCKETS,
            registry=registry,
        ).labels(model)
        self.batch_tokens = Histogram(
            f"{PREFIX}_batch_tokens",
            "Real tokens per forward pass.",
            ("model",),
            buckets=TOKEN_BUCKETS,
            registry=registry,
        ).labels(model)
        registry.register(_BatcherCollector(batcher, model))
        batcher.on_batch = self.observe_batch

    def observe_batch(self, inputs: int, tokens: int) -> None:
        self.batch_size.observe(inputs)
        self.batch_tokens.observe(tokens)
