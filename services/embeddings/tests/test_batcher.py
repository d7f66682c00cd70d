"""Dynamic batching: the batch plan, grouping of concurrent callers, fairness, cancellation,
overload and failures; and that batched vectors equal solo ones on the real model."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading

import numpy as np
import pytest

from jacana_embeddings.batcher import DynamicBatcher, plan_batches
from jacana_embeddings.config import BatcherConfig
from jacana_embeddings.errors import OverloadedError


@pytest.mark.parametrize("seed", range(20))
def test_plan_batches_properties(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([1, 2, 5, 30, 100, 256, 300]) for _ in range(rng.randint(1, 200))]
    budget, size = rng.choice([64, 512, 4096]), rng.choice([1, 8, 64])
    batches = plan_batches(lengths, budget, size)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # each input exactly once
    for batch in batches:
        assert 1 <= len(batch) <= size
        longest = max(lengths[i] for i in batch)
        if len(batch) > 1:
            real = sum(lengths[i] for i in batch)
            assert real <= budget  # real tokens: batches run packed
            assert len(batch) * longest <= 2 * real  # attention's padded grid, bounded
        assert lengths[batch[0]] == longest  # longest first
    # Sorted by length: batches do not interleave lengths.
    bounds = [(min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in batches]
    for (lo, _), (_, next_hi) in itertools.pairwise(bounds):
        assert next_hi <= lo


def test_plan_batches_cuts_padding():
    lengths = [200, 3, 190, 4, 5, 210]
    batches = plan_batches(lengths, max_batch_tokens=1000, max_batch_size=3)
    assert [sorted(b) for b in batches] == [[0, 2, 5], [1, 3, 4]]


def test_plan_batches_budget_counts_real_tokens():
    # Packed: 4 inputs of 100 tokens and 8 of 60 fit 880 real tokens; a padded budget
    # (12 x 100 = 1200) would have split them.
    lengths = [100] * 4 + [60] * 8
    assert [len(b) for b in plan_batches(lengths, 880, 64)] == [12]
    assert [len(b) for b in plan_batches(lengths, 640, 64)] == [8, 4]  # 4 x 100 + 4 x 60
    # Short inputs do not ride along with a long one: attention would pad them to it.
    lengths = [256] + [4] * 100
    batches = plan_batches(lengths, 2048, 256)
    assert batches[0][0] == 0 and len(batches[0]) <= 2  # 2 x 256 <= 2 x (256 + 4)
    assert [len(b) for b in batches[1:]] == [100 - len(batches[0]) + 1]


class FakeModel:
    """Records each batch; vectors encode (first id, length) so results are checkable.

    With ``gate`` set, each forward pass waits until the test opens the gate.
    """

    def __init__(self, dimension: int = 2, gate: bool = False) -> None:
        self.dimension = dimension
        self.batches: list[list[list[int]]] = []
        self.waiting: list[list[int]] = []  # first ids of the batches that reached the gate
        self.gate = threading.Event()
        if not gate:
            self.gate.set()
        self.fail_on: int | None = None

    def __call__(self, batch):
        self.waiting.append([ids[0] for ids in batch])
        self.gate.wait(10)
        self.batches.append([list(ids) for ids in batch])
        if self.fail_on is not None and any(ids[0] == self.fail_on for ids in batch):
            raise RuntimeError("boom")
        return np.array([[ids[0], len(ids)] for ids in batch], dtype=np.float32)


async def _started(model: FakeModel, **config) -> DynamicBatcher:
    batcher = DynamicBatcher(model, model.dimension, BatcherConfig(**config))
    batcher.start()
    return batcher


async def test_concurrent_callers_share_a_batch_and_get_their_own_vectors():
    model = FakeModel()
    batcher = await _started(model, max_wait_ms=50)
    try:
        requests = [r for i in range(10) for r in ([[i, 7]], [[i + 100] * 3, [i + 200]])]
        results = await asyncio.gather(*(batcher.embed(r) for r in requests))
        for r, got in zip(requests, results, strict=True):
            np.testing.assert_array_equal(got, [[ids[0], len(ids)] for ids in r])
        assert len(model.batches) == 1  # 30 inputs arrived within max_wait_ms
        assert batcher.stats().batches_total == 1
        assert batcher.stats().inputs_total == 30
        stats = batcher.stats()
        # the worker thread's own time is part of what the loop saw, never more
        assert 0 < stats.compute_s_total <= stats.forward_s_total
    finally:
        await batcher.close()


async def test_batches_respect_token_budget_and_sort_by_length():
    model = FakeModel()
    batcher = await _started(model, max_wait_ms=50, max_batch_tokens=40, max_batch_size=100)
    try:
        inputs = [[i] * n for i, n in enumerate([10, 1, 10, 2, 10, 1, 10, 3])]
        await batcher.embed(inputs)
        assert [[len(ids) for ids in b] for b in model.batches] == [[10, 10, 10, 10], [3, 2, 1, 1]]
        stats = batcher.stats()
        assert stats.tokens_total == 47 and stats.padded_tokens_total == 40 + 12
    finally:
        await batcher.close()


async def _two_caller_cycle(batcher: DynamicBatcher) -> None:
    """One cycle serving two callers: from now on the batcher lingers for company."""
    await asyncio.gather(batcher.embed([[90]]), batcher.embed([[91]]))


async def test_lone_caller_is_not_held_back():
    model = FakeModel()
    batcher = await _started(model, max_wait_ms=10_000)
    try:
        for i in range(3):
            await asyncio.wait_for(batcher.embed([[i]]), 2)
    finally:
        await batcher.close()


async def test_under_concurrent_traffic_an_arrival_waits_for_company():
    model = FakeModel()
    batcher = await _started(model, max_wait_ms=300)
    try:
        await _two_caller_cycle(batcher)
        first = asyncio.create_task(batcher.embed([[1]]))
        await asyncio.sleep(0.1)  # well within max_wait_ms of the first arrival
        second = asyncio.create_task(batcher.embed([[2]]))
        await asyncio.gather(first, second)
        assert [ids[0] for ids in model.batches[-1]] == [1, 2]
    finally:
        await batcher.close()


async def test_no_wait_when_queue_holds_a_full_batch():
    model = FakeModel()
    batcher = await _started(model, max_wait_ms=10_000, max_batch_tokens=16)
    try:
        await _two_caller_cycle(batcher)
        await asyncio.wait_for(batcher.embed([[1] * 16]), 2)
    finally:
        await batcher.close()


async def test_arrivals_during_a_forward_pass_form_the_next_batch():
    model = FakeModel(gate=True)
    batcher = await _started(model, max_wait_ms=0)
    try:
        first = asyncio.create_task(batcher.embed([[1]]))
        await asyncio.sleep(0.05)  # the worker now holds [[1]] at the gate
        later = [asyncio.create_task(batcher.embed([[i]])) for i in range(2, 8)]
        await asyncio.sleep(0.05)
        assert batcher.stats().queued_inputs == 6
        model.gate.set()
        await asyncio.gather(first, *later)
        assert [len(b) for b in model.batches] == [1, 6]
    finally:
        await batcher.close()


async def test_batches_in_flight_run_at_once_and_the_queue_waits_for_a_free_slot():
    model = FakeModel(gate=True)
    batcher = await _started(model, max_wait_ms=0, batches_in_flight=2)
    try:
        first = asyncio.create_task(batcher.embed([[1]]))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(batcher.embed([[2]]))
        await asyncio.sleep(0.05)  # a second worker took [[2]] while [[1]] still runs
        assert model.waiting == [[1], [2]]
        later = [asyncio.create_task(batcher.embed([[i]])) for i in range(3, 6)]
        await asyncio.sleep(0.05)
        assert model.waiting == [[1], [2]]  # both slots busy: the rest stays queued...
        assert batcher.stats().queued_inputs == 3
        model.gate.set()
        results = await asyncio.gather(first, second, *later)
        assert [r[0, 0] for r in results] == [1, 2, 3, 4, 5]
        assert sorted(len(b) for b in model.batches) == [1, 1, 3]  # ...and forms one batch
    finally:
        await batcher.close()


async def test_cancelled_caller_inputs_are_dropped():
    model = FakeModel(gate=True)
    batcher = await _started(model, max_wait_ms=0)
    try:
        first = asyncio.create_task(batcher.embed([[1]]))
        await asyncio.sleep(0.05)
        gone = asyncio.create_task(batcher.embed([[2], [3]]))
        kept = asyncio.create_task(batcher.embed([[4]]))
        await asyncio.sleep(0.05)
        gone.cancel()
        model.gate.set()
        await asyncio.gather(first, kept)
        seen = [ids[0] for b in model.batches for ids in b]
        assert seen == [1, 4]
        assert gone.cancelled()
    finally:
        await batcher.close()


async def test_queue_limit_refuses_new_requests():
    model = FakeModel(gate=True)
    batcher = await _started(model, max_wait_ms=0, max_queued_inputs=3)
    try:
        first = asyncio.create_task(batcher.embed([[1]]))
        await asyncio.sleep(0.05)
        queued = asyncio.create_task(batcher.embed([[2], [3]]))
        await asyncio.sleep(0.01)
        with pytest.raises(OverloadedError):
            await batcher.embed([[4], [5]])
        model.gate.set()
        await asyncio.gather(first, queued)
    finally:
        await batcher.close()


async def test_forward_failure_fails_only_that_batch():
    model = FakeModel()
    model.fail_on = 13
    batcher = await _started(model, max_wait_ms=0, max_batch_tokens=2, max_batch_size=1)
    try:
        bad, good = await asyncio.gather(
            batcher.embed([[13]]), batcher.embed([[5]]), return_exceptions=True
        )
        assert isinstance(bad, RuntimeError)
        np.testing.assert_array_equal(good, [[5, 1]])
        np.testing.assert_array_equal(await batcher.embed([[6, 6]]), [[6, 2]])  # still serving
    finally:
        await batcher.close()


async def test_close_fails_waiting_callers():
    model = FakeModel(gate=True)
    batcher = await _started(model, max_wait_ms=0)
    first = asyncio.create_task(batcher.embed([[1]]))
    await asyncio.sleep(0.05)
    waiting = asyncio.create_task(batcher.embed([[2]]))
    await asyncio.sleep(0.01)
    closing = asyncio.create_task(batcher.close())
    await asyncio.sleep(0.01)
    model.gate.set()
    await closing
    with pytest.raises(RuntimeError, match="shutting down"):
        await waiting
    first.cancel()
    with pytest.raises(RuntimeError, match="not running"):
        await batcher.embed([[3]])


async def test_batched_under_concurrency_equals_solo(embedder, make_service):
    texts = [f"Sentence number {i} " + "with extra words " * (i % 9) for i in range(48)]
    texts += ["lorem ipsum " * 200, "x", "Ünïcödé 東京 🙂"]
    solo = np.stack(
        [
            embedder.embed([ids for ids, _ in embedder.tokenize([t], truncate=True)])[0]
            for t in texts
        ]
    )
    service = make_service(max_wait_ms=20, max_batch_tokens=2048)
    # Requests of 1-3 texts each, all concurrent.
    groups = [texts[i : i + 1 + i % 3] for i in range(0, len(texts), 3)]
    results = await asyncio.gather(*(service.embed(texts=g, truncate=True) for g in groups))
    batched = np.concatenate([r.vectors for r in results])
    order = [t for g in groups for t in g]
    expected = np.stack([solo[texts.index(t)] for t in order])
    np.testing.assert_allclose(batched, expected, atol=1e-5)
    stats = service.batcher.stats()
    assert stats.batches_total < len(groups)  # requests really were batched together
    assert stats.padded_tokens_total < 1.5 * stats.tokens_total + 2048  # sorted: little padding
