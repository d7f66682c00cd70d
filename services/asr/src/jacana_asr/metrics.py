"""The speech-to-text service's Prometheus metrics, served on ``JACANA_ASR_METRICS_PORT``.

Read from :meth:`TranscriptionService.stats` at scrape time (what ``GetStats`` answers),
so nothing is counted twice: ``jacana_asr_audio_seconds_total`` (seconds of audio
transcribed), ``jacana_asr_requests_total``, ``jacana_asr_rejected_total`` (refused for a
full queue), ``jacana_asr_cancelled_total`` (streams stopped because their caller left)
and the ``jacana_asr_requests_running`` / ``…_waiting`` gauges, each with the served
``model`` label. With transcription jobs on, the job queue's metrics
(``jacana_asr_queue_length``, ``jacana_asr_jobs``, ``jacana_asr_job_duration_seconds``)
come from :meth:`TranscriptionJobs.metrics`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jacana_asr.service import ServiceStats

PREFIX = "jacana_asr"


class AsrStatsCollector(Collector):
    """Metrics of ``stats()`` (the service's counters), labelled ``model``."""

    def __init__(self, stats: Callable[[], ServiceStats], model: str) -> None:
        self._stats = stats
        self._model = model

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        for name, doc, value in (
            ("requests_running", "Transcriptions decoding now.", s.running),
            ("requests_waiting", "Transcriptions queued for a decoding slot.", s.waiting),
        ):
            gauge = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["model"])
            gauge.add_metric([self._model], value)
            yield gauge
        for name, doc, value in (
            ("audio_seconds", "Seconds of audio transcribed.", s.audio_seconds_total),
            ("requests", "Transcriptions served.", s.requests_total),
            ("rejected", "Transcriptions refused for a full queue.", s.rejected_total),
            ("cancelled", "Streamed transcriptions stopped: the caller left.", s.cancelled_total),
        ):
            counter = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["model"])
            counter.add_metric([self._model], value)
            yield counter


def register(registry: CollectorRegistry, stats: Callable[[], ServiceStats], model: str) -> None:
    registry.register(AsrStatsCollector(stats, model))
