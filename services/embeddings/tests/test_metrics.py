"""The embeddings service's metrics over a running batcher: each forward pass's size
and tokens, and the batcher's totals read at scrape time."""

from __future__ import annotations

import asyncio

import numpy as np
from prometheus_client import CollectorRegistry

from jacana_embeddings.batcher import DynamicBatcher
from jacana_embeddings.config import BatcherConfig
from jacana_embeddings.metrics import EmbeddingsMetrics


def _embed(batch: list[list[int]]) -> np.ndarray:
    """Each input's vector is its length, so answers can be told apart."""
    return np.array([[float(len(ids))] * 4 for ids in batch], np.float32)


async def test_batches_and_totals_are_exported():
    registry = CollectorRegistry()
    batcher = DynamicBatcher(_embed, 4, BatcherConfig())
    EmbeddingsMetrics(registry, batcher, "e")
    batcher.start()
    try:
        inputs = [[[1] * n for n in (3, 5)], [[2] * 7], [[3] * 2, [4] * 2, [5] * 2]]
        answers = await asyncio.gather(*(batcher.embed(i) for i in inputs))
    finally:
        await batcher.close()
    assert [a[:, 0].tolist() for a in answers] == [[3, 5], [7], [2, 2, 2]]

    def get(name: str) -> float:
        return registry.get_sample_value(name, {"model": "e"})

    passes = get("jacana_embeddings_batch_size_count")
    assert passes >= 1
    assert get("jacana_embeddings_batch_size_sum") == 6  # every input in some pass
    assert get("jacana_embeddings_batch_tokens_sum") == 3 + 5 + 7 + 2 * 3
    assert get("jacana_embeddings_inputs_total") == 6
    assert get("jacana_embeddings_requests_total") == 3
    assert get("jacana_embeddings_tokens_total") == 21
    assert get("jacana_embeddings_queued_inputs") == 0
