"""Tokenizer worker processes: the same ids, vectors and errors as tokenizing in the
service process, through real spawned workers and a real model."""

from __future__ import annotations

import asyncio
import pickle

import numpy as np
import pytest

from jacana_embeddings.batcher import DynamicBatcher
from jacana_embeddings.config import BatcherConfig
from jacana_embeddings.errors import InvalidRequestError
from jacana_embeddings.service import EmbeddingService

TEXTS = [f"sentence number {i} about {'rivers ' * (i % 7)}and cities" for i in range(40)]


def test_errors_and_tokenizers_survive_pickling(embedder):
    err = pickle.loads(pickle.dumps(InvalidRequestError("input[3] is empty", "input")))
    assert (type(err), err.message, err.param) == (
        InvalidRequestError,
        "input[3] is empty",
        "input",
    )
    copy = pickle.loads(pickle.dumps(embedder.tokenizer))
    assert copy.encode(TEXTS, False) == embedder.tokenizer.encode(TEXTS, False)


async def test_workers_give_what_the_service_process_gives(embedder):
    async def service(processes: int) -> EmbeddingService:
        batcher = DynamicBatcher(embedder.embed, embedder.info.dimension, BatcherConfig())
        batcher.start()  # on this loop; the workers start on a thread (spawns take ~1 s)
        return await asyncio.to_thread(
            EmbeddingService, embedder, batcher, 2048, tokenizer_processes=processes
        )

    local, workers = await service(0), await service(2)
    try:
        # concurrent requests, so calls coalesce and both workers take some
        expected, got = await asyncio.gather(
            asyncio.gather(*(local.embed(texts=TEXTS[i : i + 5]) for i in range(0, 40, 5))),
            asyncio.gather(*(workers.embed(texts=TEXTS[i : i + 5]) for i in range(0, 40, 5))),
        )
        for a, b in zip(expected, got, strict=True):
            assert a.num_tokens == b.num_tokens and a.truncated == b.truncated
            np.testing.assert_array_equal(a.vectors, b.vectors)
        assert workers.tokenize_queue.calls_total >= 2
        with pytest.raises(InvalidRequestError) as bad:
            await workers.embed(texts=["fine", ""])
        assert bad.value.param == "input" and "input[1]" in bad.value.message
        long_text = "word " * 600
        with pytest.raises(InvalidRequestError, match="truncate"):
            await workers.embed(texts=[long_text])
        cut = await workers.embed(texts=[long_text], truncate=True)
        assert cut.truncated == [True] and cut.num_tokens == [embedder.info.max_input_tokens]
    finally:
        await local.close()
        await workers.close()


async def test_a_killed_worker_fails_no_request(embedder):
    """A tokenizer worker dies (OOM killer, a crash): the pool is replaced and the
    requests it broke run again there; later requests are served as before."""
    import os
    import signal

    batcher = DynamicBatcher(embedder.embed, embedder.info.dimension, BatcherConfig())
    batcher.start()
    service = await asyncio.to_thread(
        EmbeddingService, embedder, batcher, 2048, tokenizer_processes=2
    )
    try:
        before = await service.embed(texts=TEXTS[:4])
        pool = service.tokenize_queue._executor
        for pid in list(pool._processes):
            os.kill(pid, signal.SIGKILL)
        after = await asyncio.wait_for(
            asyncio.gather(*(service.embed(texts=TEXTS[:4]) for _ in range(3))), timeout=60
        )
        for result in after:
            np.testing.assert_array_equal(result.vectors, before.vectors)
        assert service.tokenize_queue.executor_replacements == 1
        assert service.tokenize_queue._executor is not pool
    finally:
        await service.close()
