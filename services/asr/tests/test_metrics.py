"""The speech service's metrics are its stats, read at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from jacana_asr import metrics
from jacana_asr.service import ServiceStats


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
