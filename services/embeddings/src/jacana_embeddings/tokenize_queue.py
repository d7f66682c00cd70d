"""Tokenization off the event loop, coalesced across concurrent requests.

Who owns what: the pending list and the count of running calls belong to the event loop
(touched only from coroutines and loop callbacks, so no locks). Tokenizer calls run on
the queue's own small thread pool. A call takes every request pending when it starts and
encodes all their texts at once (``TextTokenizer.encode_requests``: one ``encode_batch``,
spread over the CPU's cores without the GIL). With no call running, a request starts one
at once, so nobody waits for company. While one runs, new requests wait and join the
next call, which starts when a call ends, or earlier (up to ``threads`` calls at once)
once ``overlap_texts`` texts are waiting: a call of a handful of texts would keep one
core busy while the others idle, since a batch is spread over cores text by text.
Each request gets its own result or its own error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import BrokenExecutor, Executor, ThreadPoolExecutor

from jacana_embeddings.errors import InvalidRequestError

Encoded = list[tuple[list[int], bool]]
EncodeRequestsFn = Callable[
    [Sequence[tuple[Sequence[str], bool]]], list[Encoded | InvalidRequestError]
]


class TokenizeQueue:
    """``await encode(texts, truncate) -> [(ids, truncated), ...]``, batched across callers.

    Use on one event loop; :meth:`close` at shutdown.
    """

    def __init__(
        self,
        encode_requests: EncodeRequestsFn,
        threads: int = 2,
        overlap_texts: int = 256,
        executor: Executor | None = None,
        replace_executor: Callable[[], Executor] | None = None,
    ) -> None:
        """``threads``: calls at once. ``executor`` runs them (e.g. tokenizer worker
        processes, with a picklable ``encode_requests``; closed with the queue); by
        default a pool of ``threads`` threads of this process. ``replace_executor``
        builds a new one when the executor breaks (a worker process died): the calls it
        broke run once more on the new one, so a crashed worker fails no request."""
        if threads < 1 or overlap_texts < 1:
            raise ValueError("threads and overlap_texts must be at least 1")
        self._encode_requests = encode_requests
        self._threads = threads
        self._overlap_texts = overlap_texts
        # (texts, truncate, future, attempt): attempt 1 once a broken executor dropped it
        self._pending: list[tuple[Sequence[str], bool, asyncio.Future, int]] = []
        self._pending_texts = 0
        self._running = 0
        self._executor: Executor | None = executor
        self._replace_executor = replace_executor
        self.executor_replacements = 0
        self.calls_total = 0
        self.texts_total = 0
        self.busy_s_total = 0.0  # summed wall time of the calls (they may overlap)

    async def encode(self, texts: Sequence[str], truncate: bool) -> Encoded:
        """Like ``TextTokenizer.encode``: raises InvalidRequestError for a bad text."""
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="tokenize")
        future = loop.create_future()
        self._pending.append((texts, truncate, future, 0))
        self._pending_texts += len(texts)
        if self._may_start():
            self._start(loop)
        return await future

    def _may_start(self) -> bool:
        if self._running == 0:
            return True
        return self._running < self._threads and self._pending_texts >= self._overlap_texts

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        taken = [item for item in self._pending if not item[2].done()]  # drop cancelled
        self._pending = []
        self._pending_texts = 0
        if not taken:
            return
        self._running += 1
        self.calls_total += 1
        requests = [(texts, truncate) for texts, truncate, _, _ in taken]
        self.texts_total += sum(len(texts) for texts, _ in requests)
        started = loop.time()
        try:
            call = self._submit(loop, requests)
        except Exception as error:  # nothing can run them: each fails now, none hangs
            self._running -= 1
            for _, _, future, _ in taken:
                if not future.done():
                    future.set_exception(error)
            return
        executor = self._executor
        call.add_done_callback(lambda done: self._finish(loop, taken, done, started, executor))

    def _submit(self, loop: asyncio.AbstractEventLoop, requests) -> asyncio.Future:
        """Run one call on the executor. A pool that broke while idle (a worker killed
        between calls) refuses the submission itself; it is replaced first, once."""
        try:
            return loop.run_in_executor(self._executor, self._encode_requests, requests)
        except BrokenExecutor:
            if self._replace_executor is None:
                raise
            self._replace_broken_executor()
            return loop.run_in_executor(self._executor, self._encode_requests, requests)

    def _finish(
        self,
        loop: asyncio.AbstractEventLoop,
        taken,
        done: asyncio.Future,
        started: float,
        executor: Executor | None,
    ) -> None:
        self._running -= 1
        self.busy_s_total += loop.time() - started
        failure = RuntimeError("tokenizer call cancelled") if done.cancelled() else done.exception()
        if isinstance(failure, BrokenExecutor) and self._replace_executor is not None:
            if executor is self._executor:  # the first of its calls to report it
                self._replace_broken_executor()
            retry = [(t, tr, f, attempt + 1) for t, tr, f, attempt in taken if attempt == 0]
            self._pending[:0] = retry
            self._pending_texts += sum(len(t) for t, _, _, _ in retry)
            taken = [item for item in taken if item[3] > 0]  # broke twice: they fail
        results = [failure] * len(taken) if failure is not None else done.result()
        for (_, _, future, _), result in zip(taken, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        if self._pending:
            self._start(loop)

    def _replace_broken_executor(self) -> None:
        broken, self._executor = self._executor, self._replace_executor()
        self.executor_replacements += 1
        if broken is not None:
            broken.shutdown(wait=False, cancel_futures=True)

    async def close(self) -> None:
        """Fail what is still waiting and stop the threads (after their current call)."""
        pending, self._pending = self._pending, []
        self._pending_texts = 0
        for _, _, future, _ in pending:
            if not future.done():
                future.set_exception(RuntimeError("embeddings service is shutting down"))
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown, wait=True)
