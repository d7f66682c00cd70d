"""infra/grafana/jacana.json reads only metrics the services really export.

The names come from the real registries: the gateway app's, a gRPC server's (process
metrics, calls by method and code), the engine's stats collector over a real
:class:`EngineStats`, the embeddings batcher's, the speech service's, and the job
collectors (video, transcription) over a real redis-server.
A family with labels has no samples until first used, so names are taken from each
family's type (``_total``, ``_bucket``…), as :func:`exported_names` documents.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from jacana_asr import metrics as asr_metrics
from jacana_asr.jobs import TranscriptionJobs
from jacana_asr.service import ServiceStats
from jacana_common.grpc_server import GrpcServer
from jacana_common.metrics import exported_names
from jacana_common.settings import ServiceSettings
from jacana_embeddings.batcher import DynamicBatcher
from jacana_embeddings.metrics import EmbeddingsMetrics
from jacana_engine.core.stats import EngineStats
from jacana_engine.entrypoints.metrics import EngineMetrics
from jacana_gateway.app import create_app
from jacana_gateway.settings import GatewaySettings
from jacana_jobs import LocalStorage, make_celery
from jacana_multimodal.pipelines.cards import WAN21_T2V_TINY
from jacana_multimodal.service import VideoJobs
from redis_server import RedisServer

DASHBOARD = Path(__file__).resolve().parents[1] / "infra" / "grafana" / "jacana.json"
# A metric name in PromQL: an identifier not followed by "(" (a function) nor inside
# braces/by-lists (labels); ours all start with "jacana_".
METRIC = re.compile(r"\bjacana_[a-zA-Z0-9_]+\b")


def _expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())

    def panels(items: list[dict]) -> Iterator[dict]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    return [t["expr"] for p in panels(dashboard["panels"]) for t in p.get("targets", [])]


def _registries(redis_server: RedisServer, tmp_path: Path) -> list[CollectorRegistry]:
    gateway = create_app(GatewaySettings(engines={"m": ["127.0.0.1:1"]})).state.gateway
    engine = CollectorRegistry()
    zeros = EngineStats(0, 0, 0, 0, 0, 0, 0, 0, 0)
    EngineMetrics(engine, lambda: zeros, "m")
    embeddings = CollectorRegistry()
    batcher = DynamicBatcher(lambda batch: np.zeros((len(batch), 4), np.float32), 4)
    EmbeddingsMetrics(embeddings, batcher, "e")
    asr = CollectorRegistry()
    asr_metrics.register(asr, lambda: ServiceStats(0, 0, 0, 0, 0.0), "w")
    celery = make_celery("test", redis_server.url, visibility_timeout_s=20, longest_task_s=10)
    jobs = VideoJobs(
        redis_server.client(),
        LocalStorage(tmp_path / "files"),
        celery,
        [replace(WAN21_T2V_TINY, id="v")],
        ttl_s=60.0,
        max_queued=1,
        retry_after_s=1,
    )
    video = CollectorRegistry()
    video.register(jobs.metrics())
    transcriptions = TranscriptionJobs(
        redis_server.client(),
        LocalStorage(tmp_path / "audio"),
        celery,
        model_id="w",
        queue="q",
        ttl_s=60.0,
        max_queued=1,
        retry_after_s=1,
        max_audio_seconds=1.0,
        decode_timeout_s=1.0,
    )
    asr.register(transcriptions.metrics())
    service = GrpcServer("jacana.test.v1.Nothing", ServiceSettings()).registry  # needs a loop
    return [gateway.metrics.registry, engine, embeddings, asr, video, service]


async def test_every_expression_names_exported_metrics(redis_server, tmp_path):
    exported = exported_names(_registries(redis_server, tmp_path))
    expressions = _expressions()
    assert len(expressions) >= 20
    for expr in expressions:
        names = set(METRIC.findall(expr))
        assert names, f"no Jacana metric in {expr!r}"
        assert names <= exported, f"{sorted(names - exported)} are not exported ({expr!r})"


def test_the_dashboard_covers_every_service():
    text = " ".join(_expressions())
    for prefix in ("gateway", "engine", "embeddings", "asr", "multimodal", "grpc", "process"):
        assert f"jacana_{prefix}_" in text, prefix
