"""``python -m jacana_multimodal``: serve ``jacana.multimodal.v1.Multimodal`` (the video
job API) and sweep expired videos' files. Renders run in the Celery workers
(``jacana_multimodal.worker``), not here."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from jacana_common.grpc_server import GrpcServer
from jacana_common.logging import configure_logging
from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2_grpc
from jacana_jobs.service_loop import sweep_forever
from jacana_multimodal.settings import MultimodalSettings

log = logging.getLogger("jacana_multimodal")

SERVICE_NAME = "jacana.multimodal.v1.Multimodal"


def build_jobs(settings: MultimodalSettings):
    import redis

    from jacana_jobs import LocalStorage
    from jacana_multimodal.pipelines.registry import card_for
    from jacana_multimodal.service import VideoJobs
    from jacana_multimodal.worker import create_app

    return VideoJobs(
        redis.Redis.from_url(settings.redis_url),
        LocalStorage(settings.storage_dir),
        create_app(settings),
        [card_for(spec) for spec in settings.model_specs()],
        ttl_s=settings.job_ttl_s,
        max_queued=settings.max_queued_jobs,
        retry_after_s=settings.retry_after_s,
    )


async def serve(settings: MultimodalSettings) -> None:
    from jacana_multimodal.server import MultimodalServicer

    jobs = build_jobs(settings)
    server = GrpcServer(SERVICE_NAME, settings)
    server.registry.register(jobs.metrics())
    multimodal_pb2_grpc.add_MultimodalServicer_to_server(MultimodalServicer(jobs), server.server)
    await server.start()
    sweeper = asyncio.create_task(sweep_forever(jobs.sweep, settings.sweep_interval_s, "videos"))

    async def stop() -> None:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper

    await server.run(on_stop=stop)


def main() -> None:
    settings = MultimodalSettings.load()
    configure_logging("multimodal", settings.log_level, settings.log_json)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
