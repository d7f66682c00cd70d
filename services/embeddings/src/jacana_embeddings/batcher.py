"""Dynamic batching: inputs of concurrent requests share padded forward passes.

Who owns what: the pending FIFO, the jobs and the counters belong to the event loop
(touched only from coroutines, so no locks). The model runs on dedicated worker threads
(``batches_in_flight`` of them), each of which receives a batch of token id lists and
returns their vectors; they share no state with the loop. The loop stays free to accept
and validate requests while forward passes run, and those requests form the next
batches. With more than one batch in flight, the next batch is built and launched while
the previous one still computes (on a GPU: the device queue never runs dry between
batches); a batch waits for a free slot before it is taken off the queue, so batches
still grow under load.

One cycle: wait for work; when the queue holds less than a full batch and the previous
cycle served several callers (a sign of concurrent traffic: a lone caller is not made to
wait for company that never comes), wait up to ``max_wait_ms`` after the oldest arrival
for more; take a window of the oldest inputs (FIFO, so long inputs cannot starve); sort
it by length and cut it into batches of at most ``max_batch_tokens`` real tokens
(:func:`plan_batches`); run them one by one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from jacana_embeddings.config import BatcherConfig
from jacana_embeddings.errors import OverloadedError

log = logging.getLogger(__name__)

# One cycle takes at most this many full batches' worth of queued tokens.
_WINDOW_BATCHES = 8
# A batch's padded attention grid (inputs x longest) may be this many times its real
# tokens: for short inputs attention is a small part of the work even padded, but a short
# input padded to a long one pays attention over the long one's length.
_PADDED_FACTOR = 2

EmbedFn = Callable[[Sequence[Sequence[int]]], np.ndarray]


def plan_batches(
    lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int
) -> list[list[int]]:
    """Group input indices into batches, longest inputs first.

    Batches run packed (:mod:`jacana_embeddings.varlen`), so the token-wise layers cost
    a batch's real token count: that stays within ``max_batch_tokens`` (an input longer
    than that runs alone). Attention still pads every input to the batch's longest, at a
    cost that grows with the square of that length, so a batch's padded grid
    ``len(batch) * longest`` stays within ``_PADDED_FACTOR`` times its real tokens: short
    inputs do not ride along with a much longer one. At most ``max_batch_size`` inputs per
    batch; every index appears in exactly one batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i in order:
        if current:
            grown = tokens + lengths[i]
            if (
                len(current) >= max_batch_size
                or grown > max_batch_tokens
                or (len(current) + 1) * lengths[current[0]] > _PADDED_FACTOR * grown
            ):
                batches.append(current)
                current, tokens = [], 0
        current.append(i)
        tokens += lengths[i]
    if current:
        batches.append(current)
    return batches


@dataclass
class _Job:
    """One caller's inputs; resolved when all its vectors are in."""

    future: asyncio.Future
    vectors: np.ndarray  # [N, D] float32, filled row by row
    remaining: int

    def put(self, index: int, vector: np.ndarray) -> None:
        if self.future.done():
            return
        self.vectors[index] = vector
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.vectors)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


@dataclass
class _Item:
    ids: Sequence[int]
    job: _Job
    index: int
    arrival: float


@dataclass
class BatcherStats:
    queued_inputs: int = 0
    requests_total: int = 0
    inputs_total: int = 0
    batches_total: int = 0
    tokens_total: int = 0
    padded_tokens_total: int = 0
    # wall time of the forward passes, vectors back included (summed: passes in flight
    # at once overlap)
    forward_s_total: float = 0.0
    # the same passes timed on the worker thread itself: what forward_s_total has beyond
    # it is the event loop's turnaround (handing the batch over and the vectors back)
    compute_s_total: float = 0.0


@dataclass
class DynamicBatcher:
    """``await embed(token id lists) -> vectors [N, dimension]``, batched across callers.

    Create and use on one event loop; call :meth:`start` before the first request and
    :meth:`close` at shutdown. Inputs must be non-empty and within the model's length.
    """

    embed_fn: EmbedFn
    dimension: int
    config: BatcherConfig = field(default_factory=BatcherConfig)
    # called on the event loop after each forward pass with its inputs and real tokens
    on_batch: Callable[[int, int], None] | None = None

    def __post_init__(self) -> None:
        self._pending: deque[_Item] = deque()
        self._pending_tokens = 0
        self._arrived = asyncio.Event()
        self._stats = BatcherStats()
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._last_cycle_callers = 0
        self._slots: asyncio.Semaphore | None = None  # forward passes that may still start
        self._in_flight: set[asyncio.Task] = set()

    def start(self) -> None:
        n = self.config.batches_in_flight
        self._executor = ThreadPoolExecutor(n, thread_name_prefix="embed-worker")
        self._slots = asyncio.Semaphore(n)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="embed-batcher")

    async def close(self) -> None:
        """Stop batching; callers still waiting get an error."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        while self._pending:
            self._pending.popleft().job.fail(RuntimeError("embeddings service is shutting down"))
        if self._executor is not None:
            # A forward pass may still be running: wait for it without blocking the loop.
            await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)

    def stats(self) -> BatcherStats:
        s = self._stats
        s.queued_inputs = len(self._pending)
        return BatcherStats(**vars(s))

    async def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """Vectors for ``inputs`` in their order. Raises OverloadedError when the queue
        is full; cancelling the caller drops its inputs that have not run yet."""
        if self._task is None or self._task.done():
            raise RuntimeError("batcher is not running")
        if len(self._pending) + len(inputs) > self.config.max_queued_inputs:
            raise OverloadedError(
                f"{len(self._pending)} inputs are already queued; retry later", None
            )
        loop = asyncio.get_running_loop()
        job = _Job(
            loop.create_future(),
            np.empty((len(inputs), self.dimension), np.float32),
            len(inputs),
        )
        now = loop.time()
        for index, ids in enumerate(inputs):
            self._pending.append(_Item(ids, job, index, now))
            self._pending_tokens += len(ids)
        self._arrived.set()
        vectors = await job.future
        self._stats.requests_total += 1
        return vectors

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            if not self._pending:
                continue
            await self._slots.acquire()  # the first batch of this cycle may start
            if self._last_cycle_callers > 1:
                await self._linger(loop)
            window = self._take_window()
            self._last_cycle_callers = len({id(item.job) for item in window})
            lengths = [len(item.ids) for item in window]
            plan = plan_batches(lengths, self.config.max_batch_tokens, self.config.max_batch_size)
            holding = True
            for batch in plan:
                items = [window[i] for i in batch if not window[i].job.future.done()]
                if not items:
                    continue
                if not holding:
                    await self._slots.acquire()
                holding = False
                task = loop.create_task(self._run_batch(loop, items))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
            if holding:  # every caller of the window had gone
                self._slots.release()
            if self._pending:
                self._arrived.set()

    async def _linger(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hold the first arrivals up to ``max_wait_ms`` so concurrent ones can join them."""
        deadline = self._pending[0].arrival + self.config.max_wait_ms / 1000.0
        while self._pending_tokens < self.config.max_batch_tokens:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _take_window(self) -> list[_Item]:
        budget = self.config.max_batch_tokens * _WINDOW_BATCHES
        window: list[_Item] = []
        taken = 0
        while self._pending and (not window or taken < budget):
            item = self._pending.popleft()
            self._pending_tokens -= len(item.ids)
            if item.job.future.done():  # caller gone, or failed already
                continue
            window.append(item)
            taken += len(item.ids)
        return window

    def _timed(self, batch: list[Sequence[int]]) -> tuple[np.ndarray, float]:
        started = time.perf_counter()
        vectors = self.embed_fn(batch)
        return vectors, time.perf_counter() - started

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, items: list[_Item]) -> None:
        """One forward pass on a worker thread; frees its slot when done."""
        batch = [item.ids for item in items]
        started = loop.time()
        try:
            vectors, seconds = await loop.run_in_executor(self._executor, self._timed, batch)
        except Exception as exc:
            log.exception("forward pass of %d inputs failed", len(items))
            for item in items:
                item.job.fail(exc)
            return
        finally:
            self._slots.release()
        s = self._stats
        s.forward_s_total += loop.time() - started
        s.compute_s_total += seconds
        s.batches_total += 1
        s.inputs_total += len(items)
        tokens = sum(len(ids) for ids in batch)
        s.tokens_total += tokens
        s.padded_tokens_total += len(batch) * max(len(ids) for ids in batch)
        if self.on_batch is not None:
            self.on_batch(len(items), tokens)
        for item, vector in zip(items, vectors, strict=True):
            item.job.put(item.index, vector)
