"""``python -m jacana_asr``: load the Whisper model, serve ``jacana.asr.v1.Asr``; with
``JACANA_ASR_REDIS_URL`` set, also accept transcription jobs and sweep expired jobs' files
(the jobs run in the Celery workers, ``jacana_asr.worker``, not here)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from jacana_asr.settings import AsrSettings
from jacana_common.grpc_server import GrpcServer
from jacana_common.interpreter import set_gil_switch_interval
from jacana_common.logging import configure_logging
from jacana_common.pb.jacana.asr.v1 import asr_pb2_grpc
from jacana_jobs.service_loop import sweep_forever

log = logging.getLogger("jacana_asr")

SERVICE_NAME = "jacana.asr.v1.Asr"


async def build_service(settings: AsrSettings):
    """Load the model (on a thread) and warm it up on a second of silence."""
    import numpy as np
    import torch  # heavy import, after logging is set up

    from jacana_asr.service import TranscriptionService
    from jacana_asr.transcriber import WhisperTranscriber
    from jacana_asr.transcription import SAMPLE_RATE, TranscribeOptions
    from jacana_asr.vad import SileroVad
    from jacana_asr.vad_transcriber import VadTranscriber

    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    log.info("loading %s from %s on %s", settings.model_id, settings.model, settings.device)
    started = time.perf_counter()
    transcriber = await asyncio.to_thread(
        WhisperTranscriber,
        settings.model,
        settings.device,
        max_batch_windows=settings.max_batch_windows,
    )
    # The first call pays for lazy initialisation; do not bill it to a client.
    silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
    await asyncio.to_thread(transcriber.transcribe, silence, TranscribeOptions())
    log.info("model ready in %.1fs", time.perf_counter() - started)
    filtered = VadTranscriber(transcriber, SileroVad(settings.vad_model), settings.vad_min_seconds)
    return TranscriptionService(
        filtered, model_id=settings.model_id, device=settings.device, limits=settings.limits()
    )


def build_jobs(settings: AsrSettings):
    """The job API over the configured Redis; None when no Redis is configured."""
    if not settings.redis_url:
        return None
    import redis

    from jacana_asr.jobs import TranscriptionJobs
    from jacana_asr.worker import create_app
    from jacana_jobs import LocalStorage

    return TranscriptionJobs(
        redis.Redis.from_url(settings.redis_url),
        LocalStorage(settings.storage_dir),
        create_app(settings),
        model_id=settings.model_id,
        queue=settings.job_queue,
        ttl_s=settings.job_ttl_s,
        max_queued=settings.max_queued_jobs,
        retry_after_s=settings.retry_after_s,
        max_audio_seconds=settings.max_job_audio_seconds,
        decode_timeout_s=settings.decode_timeout_s,
        ffmpeg=settings.ffmpeg,
    )


async def serve(settings: AsrSettings) -> None:
    from jacana_asr import metrics
    from jacana_asr.job_server import AsrJobServicer

    service = await build_service(settings)
    jobs = build_jobs(settings)
    server = GrpcServer(SERVICE_NAME, settings)
    metrics.register(server.registry, service.stats, service.model_id)
    if jobs is not None:
        server.registry.register(jobs.metrics())
    asr_pb2_grpc.add_AsrServicer_to_server(AsrJobServicer(service, jobs), server.server)
    await server.start()
    sweeper = None
    if jobs is not None:
        sweeper = asyncio.create_task(
            sweep_forever(jobs.sweep, settings.sweep_interval_s, "transcription jobs")
        )
    else:
        log.info("transcription jobs are off (no JACANA_ASR_REDIS_URL)")

    async def stop() -> None:
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        await service.close()

    await server.run(on_stop=stop)


def main() -> None:
    settings = AsrSettings.load()
    configure_logging("asr", settings.log_level, settings.log_json)
    set_gil_switch_interval(settings.gil_switch_interval_us)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
