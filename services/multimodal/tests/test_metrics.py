"""The video job metrics on a real redis-server, scraped over HTTP from the exporter a
service runs: queue length, jobs by status and the durations of completed renders."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from jacana_common.metrics import MetricsExporter
from jacana_jobs import LocalStorage, make_celery
from jacana_multimodal.pipelines.cards import WAN21_T2V_TINY
from jacana_multimodal.service import CreateRequest, VideoJobs
from redis_server import RedisServer


def _scrape(url: str) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(url, timeout=10).raise_for_status().text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_queue_states_and_render_durations(redis_server: RedisServer, tmp_path: Path):
    celery = make_celery("test", redis_server.url, visibility_timeout_s=20, longest_task_s=10)
    jobs = VideoJobs(
        redis_server.client(),
        LocalStorage(tmp_path / "files"),
        celery,
        [replace(WAN21_T2V_TINY, id="wan")],
        ttl_s=3600.0,
        max_queued=8,
        retry_after_s=7,
    )
    registry = CollectorRegistry()
    registry.register(jobs.metrics())
    exporter = MetricsExporter(registry, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    try:
        empty = _scrape(url)
        assert empty[("jacana_multimodal_queue_length", frozenset())] == 0
        assert empty[("jacana_multimodal_job_duration_seconds_gcount", frozenset())] == 0

        ids = [
            jobs.create(CreateRequest(model="", prompt=f"heron {i}")).record.id for i in range(4)
        ]
        # what a render worker does with the records: one finished, one running, one failed
        jobs.store.start(ids[0])
        jobs.store.complete(ids[0], {})
        jobs.store.start(ids[1])
        jobs.store.start(ids[2])
        jobs.store.fail(ids[2], "render_failed", "out of memory")
        s = _scrape(url)
    finally:
        exporter.stop()

    def status(name: str) -> float:
        return s[("jacana_multimodal_jobs", frozenset({("status", name)}))]

    # the broker's list still holds every enqueued task (no worker consumed them)
    assert s[("jacana_multimodal_queue_length", frozenset())] == 4
    assert (status("queued"), status("in_progress"), status("completed")) == (1, 1, 1)
    assert (status("failed"), status("cancelled")) == (1, 0)
    assert s[("jacana_multimodal_job_duration_seconds_gcount", frozenset())] == 1
    le_1s = ("jacana_multimodal_job_duration_seconds_bucket", frozenset({("le", "1.0")}))
    assert s[le_1s] == 1  # started and completed within the test
    assert 0 <= s[("jacana_multimodal_job_duration_seconds_gsum", frozenset())] < 1
