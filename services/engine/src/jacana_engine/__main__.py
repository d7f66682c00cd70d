"""``python -m jacana_engine``: load the model, then serve ``jacana.engine.v1.Engine``."""

from __future__ import annotations

import asyncio
import logging
import time

from jacana_common.grpc_server import GrpcServer
from jacana_common.interpreter import set_gil_switch_interval
from jacana_common.logging import configure_logging
from jacana_common.pb.jacana.engine.v1 import engine_pb2_grpc
from jacana_engine.entrypoints.settings import EngineSettings

log = logging.getLogger("jacana_engine")


async def serve(settings: EngineSettings) -> None:
    from jacana_engine.core.async_engine import AsyncEngine  # heavy import (torch), after logging
    from jacana_engine.entrypoints.metrics import EngineMetrics
    from jacana_engine.entrypoints.server import EngineServicer

    if settings.num_threads:
        import torch

        torch.set_num_threads(settings.num_threads)
    config = settings.engine_config()
    log.info(
        "loading %s from %s (%s on %s)", config.model_id, config.model, config.dtype, config.device
    )
    started = time.perf_counter()
    engine = await asyncio.to_thread(AsyncEngine, config)
    log.info("model ready in %.1fs", time.perf_counter() - started)
    server = GrpcServer("jacana.engine.v1.Engine", settings)
    metrics = EngineMetrics(server.registry, engine.stats, config.model_id)
    engine_pb2_grpc.add_EngineServicer_to_server(EngineServicer(engine, metrics), server.server)
    await server.start()
    await server.run(on_stop=engine.shutdown)


def main() -> None:
    settings = EngineSettings.load()
    configure_logging("engine", settings.log_level, settings.log_json)
    set_gil_switch_interval(settings.gil_switch_interval_us)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
