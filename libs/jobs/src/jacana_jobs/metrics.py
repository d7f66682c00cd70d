"""Prometheus metrics of one job family, read from Redis by the service that owns it.

The Celery workers run under prefork: a pool child lives for one task or many, so an
exporter per worker would need Prometheus' multiprocess mode and a port per machine. The
numbers are in Redis already, so the service that accepts the jobs exports them at
scrape time instead (:class:`JobMetricsCollector`):

- ``<prefix>_queue_length``: tasks waiting in the Celery queue (the broker's Redis list);
- ``<prefix>_jobs{status}``: the job records held now (not yet expired) by status;
- ``<prefix>_job_duration_seconds``: a gauge histogram of ``completed_at - started_at``
  over the completed records held now, so its window is the job TTL. The records carry
  both times, so the duration is written once, by the worker, and needs no second
  channel; with several service replicas each reports the same numbers (aggregate with
  ``max``, not ``sum``).

A scrape reads every held record of the family (pipelined, 100 at a time): cheap for
what the admission limit lets through, a few hundred to a few thousand records per TTL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

import redis
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jacana_jobs.celery_app import queue_length
from jacana_jobs.records import JobRecord, JobStatus
from jacana_jobs.store import JobStore

# Renders and long transcriptions: seconds to hours.
DURATION_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
_PAGE = 100


class JobMetricsCollector(Collector):
    """Queue length, jobs by status and job durations of ``kind`` jobs in ``store``."""

    def __init__(
        self,
        client: redis.Redis,
        store: JobStore,
        kind: str,
        queue: str,
        prefix: str,
        buckets: Sequence[float] = DURATION_BUCKETS,
    ) -> None:
        self._redis = client
        self._store = store
        self._kind = kind
        self._queue = queue
        self._prefix = prefix
        self._buckets = tuple(buckets)

    def _records(self) -> Iterator[JobRecord]:
        after = None
        while True:
            page = self._store.list(self._kind, after, _PAGE, "asc")
            yield from page.records
            if not page.has_more or not page.records:
                return
            after = page.records[-1].id

    def collect(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily(
            f"{self._prefix}_queue_length", "Tasks waiting in the job queue."
        )
        queued.add_metric([], queue_length(self._redis, self._queue))
        yield queued
        statuses: Counter[str] = Counter()
        durations: list[float] = []
        for record in self._records():
            statuses[record.status.value] += 1
            if record.status is JobStatus.COMPLETED and record.started_at and record.completed_at:
                durations.append(record.completed_at - record.started_at)
        jobs = GaugeMetricFamily(
            f"{self._prefix}_jobs", "Job records held now, by status.", labels=["status"]
        )
        for status in JobStatus:
            jobs.add_metric([status.value], statuses[status.value])
        yield jobs
        yield self._histogram(durations)

    def _histogram(self, durations: list[float]) -> Metric:
        buckets = [(str(float(b)), sum(d <= b for d in durations)) for b in self._buckets]
        buckets.append(("+Inf", len(durations)))
        return GaugeHistogramMetricFamily(
            f"{self._prefix}_job_duration_seconds",
            "From start to completion of the completed jobs held now (window: the job TTL).",
            buckets=buckets,
            gsum_value=sum(durations),
        )
