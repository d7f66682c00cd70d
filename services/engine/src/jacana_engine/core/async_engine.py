"""asyncio front of the engine: the step loop runs on its own thread, callers await streams.

Threads and state:
- the engine thread owns the :class:`LLMEngine` (and through it the model, KV cache and
  scheduler) and the table of open output streams; nothing else touches them.
- callers (any asyncio loop) hand work over as commands on a queue guarded by a
  condition variable; each command's result comes back through a
  ``concurrent.futures.Future``. Outputs go back with ``loop.call_soon_threadsafe`` into
  the stream's ``asyncio.Queue``, once per step and loop.
- torch releases the GIL inside its kernels, so the event loop stays responsive while a
  step runs. The engine thread sleeps on the condition when it has nothing to do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jacana_engine.config import EngineConfig
from jacana_engine.core.engine import EngineStats, LLMEngine
from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.core.outputs import FinishReason, RequestOutput, merge_outputs
from jacana_engine.pooling.requests import EmbeddingOutput
from jacana_engine.sample.params import SamplingParams

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread has stopped (shut down, or a step failed); no request can run."""


@dataclass(eq=False)
class _Stream:
    """One request's path back to its caller's event loop."""

    loop: asyncio.AbstractEventLoop
    num_prompt_tokens: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    num_output_tokens: int = 0  # as last delivered, for the usage of an abort output


class AsyncEngine:
    """Thread-backed asyncio interface over one :class:`LLMEngine`.

    Construct with an ``EngineConfig`` (loads the model; blocking, so call it from a
    worker thread in async code) or with a ready ``engine=``.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        engine: LLMEngine | None = None,
        stream_interval: int | None = None,
    ):
        if engine is None:
            if config is None:
                raise ValueError("AsyncEngine needs a config or an engine")
            engine = LLMEngine(config)
        self.engine = engine
        # tokens a streamed delta gathers before it is sent (EngineConfig.stream_interval)
        self.stream_interval = stream_interval or engine.config.stream_interval
        self.tokenizer = engine.tokenizer
        self.model_info = engine.model_info
        self._cond = threading.Condition()
        self._commands: deque[tuple[Callable[[], Any], concurrent.futures.Future]] = deque()
        self._stopping = False
        self._dead: BaseException | None = None
        self._streams: dict[str, _Stream] = {}  # engine thread only
        self._stats = engine.stats()  # replaced (never mutated) by the engine thread
        self._thread = threading.Thread(target=self._run, name="jacana-engine", daemon=True)
        self._thread.start()

    # ---- caller side (any event loop) ---------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        speculative: bool = True,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; the last one has ``finished=True``. Outputs that
        queued up while the consumer was busy come merged into one (``merge_outputs``),
        and after the first one each carries at least ``stream_interval`` tokens (the last
        one excepted).

        ``priority``, ``cache_salt`` and ``speculative`` (False: the request never
        drafts) are passed to :meth:`LLMEngine.add_request`.

        Raises :class:`InvalidRequestError` (at the first iteration) for a request the
        engine rejects. Closing the iterator early, or cancelling its consumer, aborts
        the request and frees its KV blocks.
        """
        prompt = list(prompt_token_ids)
        stream = _Stream(asyncio.get_running_loop(), len(prompt))
        finished = False
        try:
            await asyncio.wrap_future(
                self._submit(
                    lambda: self._add(
                        request_id,
                        prompt,
                        sampling_params,
                        stream,
                        priority,
                        cache_salt,
                        speculative,
                    )
                )
            )
            error: BaseException | None = None
            deltas: list[RequestOutput] = []  # not sent yet
            sent_first = False
            while not finished:
                item = error or await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                # A consumer that fell behind gets what piled up as one delta: fewer, larger
                # stream messages exactly when per-message costs are what slows it down.
                deltas.append(item)
                while not deltas[-1].finished and not stream.queue.empty():
                    nxt = stream.queue.get_nowait()
                    if isinstance(nxt, BaseException):
                        error = nxt  # after the tokens that came before it
                        break
                    deltas.append(nxt)
                tokens = sum(len(d.new_token_ids) for d in deltas)
                due = deltas[-1].finished or error is not None or not sent_first
                if due or tokens >= self.stream_interval:
                    merged = merge_outputs(deltas)
                    deltas, sent_first, finished = [], True, merged.finished
                    yield merged
        finally:
            if not finished:  # consumer left early: fire and forget
                self._submit(lambda: self._abort(request_id, stream))

    async def embed(
        self, request_id: str, inputs: Sequence[Sequence[int]], *, priority: int = 0
    ) -> list[EmbeddingOutput]:
        """Embed each token id list as its own engine request (``{request_id}/<i>``), all
        queued by one command so they share batches; outputs in input order.

        Raises :class:`InvalidRequestError` naming the first bad input (then none is
        queued). Cancelling the caller aborts the inputs not finished yet.
        """
        loop = asyncio.get_running_loop()
        prompts = [list(p) for p in inputs]
        ids = [f"{request_id}/{i}" for i in range(len(prompts))]
        streams = [_Stream(loop, len(p)) for p in prompts]
        await asyncio.wrap_future(
            self._submit(lambda: self._add_embeds(ids, prompts, streams, priority))
        )
        results: list[EmbeddingOutput] = []
        try:
            for stream in streams:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if not isinstance(item, EmbeddingOutput):  # aborted by a shutdown
                    raise EngineDeadError("the engine stopped before the embedding finished")
                results.append(item)
            return results
        finally:
            left = list(zip(ids, streams, strict=True))[len(results) :]
            if left:  # fire and forget, as for an abandoned generation
                self._submit(lambda: [self._abort(rid, stream) for rid, stream in left])

    async def abort(self, request_id: str) -> bool:
        """Abort a request; its stream ends with an ABORT output. False if not running."""
        return await asyncio.wrap_future(self._submit(lambda: self._abort(request_id, None)))

    def stats(self) -> EngineStats:
        """The engine's counters as of its last step or command."""
        return self._stats

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self._dead is None

    async def shutdown(self) -> None:
        """Abort what is left (streams end with ABORT) and stop the engine thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        await asyncio.to_thread(self._thread.join)

    def _submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._stopping or self._dead is not None:
                fut.set_exception(EngineDeadError("the engine is not running"))
                return fut
            self._commands.append((fn, fut))
            self._cond.notify()
        return fut

    # ---- engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while (
                        not self._commands
                        and not self._stopping
                        and not self.engine.has_unfinished_requests()
                    ):
                        self._cond.wait()
                    commands = list(self._commands)
                    self._commands.clear()
                    stopping = self._stopping
                for fn, fut in commands:
                    try:
                        fut.set_result(fn())
                    except Exception as exc:
                        fut.set_exception(exc)
                if stopping:
                    for request_id in list(self._streams):
                        self._abort(request_id, None)
                    self._stats = self.engine.stats()
                    return
                if self.engine.has_unfinished_requests():
                    outputs = self.engine.step()
                    # Before the outputs go out: whoever reads a final output and then
                    # asks for stats sees that request counted.
                    self._stats = self.engine.stats()
                    self._dispatch(outputs)
                self._stats = self.engine.stats()
        except BaseException as exc:
            log.exception("engine step failed; the engine is stopping")
            self._die(exc)

    def _add(
        self,
        request_id: str,
        prompt: list[int],
        sp: SamplingParams,
        stream: _Stream,
        priority: int = 0,
        cache_salt: str | None = None,
        speculative: bool = True,
    ) -> None:
        if request_id in self._streams:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        self.engine.add_request(
            request_id,
            prompt,
            sp,
            priority=priority,
            cache_salt=cache_salt,
            speculative=speculative,
        )
        self._streams[request_id] = stream

    def _add_embeds(
        self, ids: list[str], prompts: list[list[int]], streams: list[_Stream], priority: int
    ) -> None:
        """Queue every input, or none: a rejected one takes back those queued before it."""
        for i, (rid, prompt, stream) in enumerate(zip(ids, prompts, streams, strict=True)):
            try:
                if rid in self._streams:
                    raise InvalidRequestError(f"request id {rid!r} is already in use", "request_id")
                self.engine.add_embed_request(rid, prompt, priority=priority)
            except InvalidRequestError as exc:
                for queued in ids[:i]:
                    self.engine.abort_request(queued)
                    del self._streams[queued]
                if exc.param != "input" or len(prompts) == 1:
                    raise
                raise InvalidRequestError(f"input[{i}]: {exc.message}", exc.param) from None
            self._streams[rid] = stream

    def _abort(self, request_id: str, stream: _Stream | None) -> bool:
        """Abort ``request_id``; with ``stream``, only if that stream still owns the id
        (the caller left, nobody to tell). Without, the open stream gets an ABORT output."""
        current = self._streams.get(request_id)
        if stream is not None and current is not stream:
            return False
        found = self.engine.abort_request(request_id)
        if current is not None:
            del self._streams[request_id]
            if stream is None:
                final = RequestOutput(
                    request_id,
                    finished=True,
                    finish_reason=FinishReason.ABORT,
                    num_prompt_tokens=current.num_prompt_tokens,
                    num_output_tokens=current.num_output_tokens,
                )
                self._send({current.loop: [(current, final)]})
        return found

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]] = defaultdict(list)
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            stream.num_output_tokens = out.num_output_tokens
            if out.finished:
                del self._streams[out.request_id]
            by_loop[stream.loop].append((stream, out))
        self._send(by_loop)

    def _send(self, by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]]) -> None:
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the caller's loop is closed: nobody will read these
                for stream, item in items:
                    if isinstance(item, RequestOutput) and not item.finished:
                        self._abort(item.request_id, stream)

    def _die(self, exc: BaseException) -> None:
        with self._cond:
            self._dead = exc
            pending = list(self._commands)
            self._commands.clear()
        error = EngineDeadError(f"the engine stopped: {exc!r}")
        for _, fut in pending:
            fut.set_exception(error)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]] = defaultdict(list)
        for request_id, stream in self._streams.items():
            by_loop[stream.loop].append((stream, error))
            with contextlib.suppress(Exception):  # best effort: give the blocks back
                self.engine.abort_request(request_id)
        self._streams.clear()
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[tuple[_Stream, Any]]) -> None:
    """Runs on the caller's loop: hand each item to its stream."""
    for stream, item in items:
        stream.queue.put_nowait(item)
