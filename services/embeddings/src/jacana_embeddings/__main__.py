"""``python -m jacana_embeddings``: load the model, serve ``jacana.embeddings.v1.Embeddings``."""

from __future__ import annotations

import asyncio
import logging
import time

from jacana_common.grpc_server import GrpcServer
from jacana_common.interpreter import set_gil_switch_interval
from jacana_common.logging import configure_logging
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2_grpc
from jacana_embeddings.settings import EmbeddingsSettings

log = logging.getLogger("jacana_embeddings")

SERVICE_NAME = "jacana.embeddings.v1.Embeddings"


async def build_service(settings: EmbeddingsSettings):
    """Load the model (on a thread), warm it up and start the batcher on this loop."""
    import torch  # heavy import, after logging is set up

    from jacana_embeddings.batcher import DynamicBatcher
    from jacana_embeddings.embedder import Embedder
    from jacana_embeddings.service import EmbeddingService

    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    config = settings.embedder_config()
    log.info(
        "loading %s from %s (%s on %s)",
        config.model_id,
        config.model_dir,
        config.dtype,
        config.device,
    )
    started = time.perf_counter()
    embedder = await asyncio.to_thread(Embedder, config)
    # The first forward pass pays for lazy initialisation; do not bill it to a client.
    await asyncio.to_thread(embedder.embed, [[0, 0]])
    info = embedder.info
    log.info(
        "model ready in %.1fs: %s, dimension %d, max %d tokens, pooling %s, normalized %s, "
        "matryoshka %s, linear backend %s",
        time.perf_counter() - started,
        info.architecture,
        info.dimension,
        info.max_input_tokens,
        info.pooling,
        info.normalized,
        list(info.matryoshka_dims),
        embedder.linear_backend,
    )
    if embedder.graphs is not None:
        log.info(
            "%d padded batch shapes ready in %.1fs (captured as CUDA graphs: %s)",
            len(embedder.graphs.shapes),
            embedder.graph_prepare_s,
            embedder.graphs.capture,
        )
    batcher = DynamicBatcher(embedder.embed, info.dimension, settings.batcher_config())
    batcher.start()
    processes = settings.resolved_tokenizer_processes()
    if processes:
        log.info("tokenizing in %d worker processes", processes)
    return await asyncio.to_thread(
        EmbeddingService, embedder, batcher, settings.max_inputs_per_request, processes
    )


async def serve(settings: EmbeddingsSettings) -> None:
    from jacana_embeddings.metrics import EmbeddingsMetrics
    from jacana_embeddings.server import EmbeddingsServicer

    service = await build_service(settings)
    server = GrpcServer(SERVICE_NAME, settings)
    EmbeddingsMetrics(server.registry, service.batcher, service.info.model_id)
    embeddings_pb2_grpc.add_EmbeddingsServicer_to_server(EmbeddingsServicer(service), server.server)
    await server.start()
    await server.run(on_stop=service.close)


def main() -> None:
    settings = EmbeddingsSettings.load()
    configure_logging("embeddings", settings.log_level, settings.log_json)
    set_gil_switch_interval(settings.gil_switch_interval_us)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
