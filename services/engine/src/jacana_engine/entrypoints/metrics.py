"""The engine's Prometheus metrics, served on ``JACANA_ENGINE_METRICS_PORT``.

Two sources, nothing counted twice:
- :class:`EngineStatsCollector` turns the engine's own :class:`~jacana_engine.core.stats.
  EngineStats` snapshot (what ``GetStats`` answers) into metrics at each scrape: running
  and waiting requests, KV blocks, the prefix cache, token and request counters and the
  speculative counters per proposer. It reads the snapshot the engine thread already
  publishes, so a scrape costs the engine nothing and never waits for a step.
- :class:`EngineMetrics` adds what only the gRPC front sees, per request: time to first
  token, time per output token and end-to-end latency (from the ``Generate`` call's
  arrival, tokenization included), observed by the servicer.

Every family carries a ``model`` label (the served model id), so several engines behind
one Prometheus stay apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jacana_common.metrics import LatencyHistograms
from jacana_engine.core.stats import EngineStats

PREFIX = "jacana_engine"


class EngineStatsCollector(Collector):
    """Metrics read from ``stats()`` (the engine's latest snapshot) at scrape time."""

    def __init__(self, stats: Callable[[], EngineStats], model: str) -> None:
        self._stats = stats
        self._model = model

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        labels, model = ["model"], [self._model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)
            family.add_metric(model, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)
            family.add_metric(model, value)
            return family

        yield gauge("num_requests_running", "Requests in the running batch.", s.num_running)
        yield gauge("num_requests_waiting", "Requests queued for admission.", s.num_waiting)
        yield gauge("kv_blocks_total", "KV cache blocks in the pool.", s.kv_blocks_total)
        yield gauge("kv_blocks_used", "KV cache blocks owned by requests.", s.kv_blocks_used)
        yield gauge("kv_blocks_free", "KV cache blocks no request owns.", s.kv_blocks_free)
        yield gauge(
            "kv_blocks_cached",
            "Free KV blocks still holding a reusable prefix.",
            s.kv_blocks_cached,
        )
        yield gauge(
            "prefix_cache_hit_rate",
            "Share of looked-up prompt tokens found in the prefix cache since start.",
            s.prefix_cache_hit_rate,
        )
        yield counter(
            "prefix_cache_queries",
            "Prompt tokens of admitted requests looked up in the prefix cache.",
            s.prefix_cache_queries_total,
        )
        yield counter(
            "prefix_cache_hits",
            "Looked-up prompt tokens found in the prefix cache.",
            s.prefix_cache_hits_total,
        )
        yield counter(
            "prompt_tokens",
            "Prompt tokens computed (prefix-cache hits excluded).",
            s.prompt_tokens_total,
        )
        yield counter("generation_tokens", "Tokens generated.", s.generation_tokens_total)
        yield counter(
            "requests_finished",
            "Engine requests finished (each choice).",
            s.requests_finished_total,
        )
        yield counter("steps", "Engine steps run.", s.steps_total)
        yield counter("preemptions", "Requests preempted for KV space.", s.preemptions_total)
        yield from _speculative(s, self._model)


def _speculative(s: EngineStats, model: str) -> Iterator[Metric]:
    """Draft counters per proposer (the families exist, empty, without speculation)."""
    labels = ["model", "proposer"]
    proposals = CounterMetricFamily(
        f"{PREFIX}_spec_proposals",
        "Draft proposals made (one per request and step).",
        labels=labels,
    )
    drafted = CounterMetricFamily(
        f"{PREFIX}_spec_draft_tokens", "Draft tokens proposed.", labels=labels
    )
    accepted = CounterMetricFamily(
        f"{PREFIX}_spec_accepted_tokens", "Draft tokens the target accepted.", labels=labels
    )
    rate = GaugeMetricFamily(
        f"{PREFIX}_spec_acceptance_rate",
        "Accepted share of the draft tokens since start.",
        labels=labels,
    )
    for name, p in sorted(s.speculative.items()):
        proposals.add_metric([model, name], p.proposals)
        drafted.add_metric([model, name], p.draft_tokens)
        accepted.add_metric([model, name], p.accepted_tokens)
        rate.add_metric([model, name], p.acceptance_rate)
    yield from (proposals, drafted, accepted, rate)


class EngineMetrics:
    """The engine's metrics in ``registry``: the stats collector and the latency
    histograms the servicer observes (``latency``, labelled by model)."""

    def __init__(
        self, registry: CollectorRegistry, stats: Callable[[], EngineStats], model: str
    ) -> None:
        self.model = model
        registry.register(EngineStatsCollector(stats, model))
        self.latency = LatencyHistograms.register(registry, PREFIX, ("model",))
