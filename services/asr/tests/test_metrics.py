"""The speech service's metrics: its stats, read at scrape time, and its transcription
jobs, read from a real redis-server."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from jacana_asr import metrics
from jacana_asr.jobs import JOB_KIND, TranscriptionJobs
from jacana_asr.service import ServiceStats
from jacana_jobs import LocalStorage, make_celery
from redis_server import RedisServer


def test_stats_are_exported_with_the_model_label():
    stats = ServiceStats(
        running=1, waiting=2, requests_total=3, rejected_total=0, audio_seconds_total=0.0
    )
    registry = CollectorRegistry()
    metrics.register(registry, lambda: stats, "whisper")

    def get(name: str) -> float:
        return registry.get_sample_value(name, {"model": "whisper"})

    assert get("jacana_asr_requests_running") == 1
    assert get("jacana_asr_requests_waiting") == 2
    assert get("jacana_asr_requests_total") == 3
    assert get("jacana_asr_audio_seconds_total") == 0
    stats = ServiceStats(0, 0, 4, 1, 12.5)  # read again at the next scrape
    assert get("jacana_asr_audio_seconds_total") == 12.5
    assert get("jacana_asr_rejected_total") == 1


def test_transcription_jobs_are_exported_from_redis(tmp_path: Path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        celery = make_celery("test", server.url, visibility_timeout_s=20, longest_task_s=10)
        jobs = TranscriptionJobs(
            server.client(),
            LocalStorage(tmp_path / "files"),
            celery,
            model_id="whisper",
            queue="jacana.test.transcription",
            ttl_s=60.0,
            max_queued=8,
            retry_after_s=7,
            max_audio_seconds=10.0,
            decode_timeout_s=30.0,
        )
        registry = CollectorRegistry()
        registry.register(jobs.metrics())
        done, running = (jobs.store.create(JOB_KIND, "whisper", {}, 60.0).id for _ in range(2))
        jobs.store.start(done)
        jobs.store.complete(done, {})
        jobs.store.start(running)

        def get(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, labels)

        assert get("jacana_asr_queue_length") == 0
        assert get("jacana_asr_jobs", status="completed") == 1
        assert get("jacana_asr_jobs", status="in_progress") == 1
        assert get("jacana_asr_jobs", status="queued") == 0
        assert get("jacana_asr_job_duration_seconds_gcount") == 1
    finally:
        server.stop()
