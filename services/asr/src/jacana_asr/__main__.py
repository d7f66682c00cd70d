"""``python -m jacana_asr``: load the Whisper model, serve ``jacana.asr.v1.Asr``."""

from __future__ import annotations

import asyncio
import logging
import time

from jacana_asr.settings import AsrSettings
from jacana_common.grpc_server import GrpcServer
from jacana_common.interpreter import set_gil_switch_interval
from jacana_common.logging import configure_logging
from jacana_common.pb.jacana.asr.v1 import asr_pb2_grpc

log = logging.getLogger("jacana_asr")

SERVICE_NAME = "jacana.asr.v1.Asr"


async def build_service(settings: AsrSettings):
    """Load the model (on a thread) and warm it up on a second of silence."""
    import numpy as np
    import torch  # heavy import, after logging is set up

    from jacana_asr.service import TranscriptionService
    from jacana_asr.transcriber import WhisperTranscriber
    from jacana_asr.transcription import SAMPLE_RATE, TranscribeOptions

    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    log.info("loading %s from %s on %s", settings.model_id, settings.model, settings.device)
    started = time.perf_counter()
    transcriber = await asyncio.to_thread(WhisperTranscriber, settings.model, settings.device)
    # The first call pays for lazy initialisation; do not bill it to a client.
    silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
    await asyncio.to_thread(transcriber.transcribe, silence, TranscribeOptions())
    log.info("model ready in %.1fs", time.perf_counter() - started)
    return TranscriptionService(
        transcriber, model_id=settings.model_id, device=settings.device, limits=settings.limits()
    )


async def serve(settings: AsrSettings) -> None:
    from jacana_asr.server import AsrServicer

    service = await build_service(settings)
    server = GrpcServer(SERVICE_NAME, settings)
    asr_pb2_grpc.add_AsrServicer_to_server(AsrServicer(service), server.server)
    await server.start()
    await server.run(on_stop=service.close)


def main() -> None:
    settings = AsrSettings.load()
    configure_logging("asr", settings.log_level, settings.log_json)
    set_gil_switch_interval(settings.gil_switch_interval_us)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
