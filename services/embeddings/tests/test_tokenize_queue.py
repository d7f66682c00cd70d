"""TokenizeQueue: tokenization off the event loop, coalesced across concurrent requests."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import BrokenExecutor, Executor, ThreadPoolExecutor

import pytest

from jacana_embeddings.errors import InvalidRequestError
from jacana_embeddings.tokenize_queue import TokenizeQueue


class FakeTokenizer:
    """``encode_requests`` that records each call; ids are the texts' lengths. A text
    "bad" fails its request. With ``gate``, each call waits until the test opens it;
    ``entered`` is set when a call has started."""

    def __init__(self, gate: bool = False) -> None:
        self.calls: list[list[list[str]]] = []
        self.threads: set[str] = set()
        self.entered = threading.Event()
        self.gate = threading.Event()
        if not gate:
            self.gate.set()

    async def running(self) -> None:
        """Wait until a call is inside the tokenizer (blocked on the gate)."""
        assert await asyncio.to_thread(self.entered.wait, 10)
        self.entered.clear()

    def encode_requests(self, requests):
        self.entered.set()
        self.gate.wait(10)
        self.calls.append([list(texts) for texts, _ in requests])
        self.threads.add(threading.current_thread().name)
        return [
            InvalidRequestError("bad text", "input")
            if "bad" in texts
            else [([len(t)], truncate) for t in texts]
            for texts, truncate in requests
        ]


async def test_requests_arriving_during_a_call_share_the_next_one():
    tok = FakeTokenizer(gate=True)
    queue = TokenizeQueue(tok.encode_requests, threads=1)
    first = asyncio.create_task(queue.encode(["a"], False))
    await tok.running()
    later = [asyncio.create_task(queue.encode(["b" * i], i % 2 == 0)) for i in range(1, 5)]
    await asyncio.sleep(0)  # the new callers are queued
    tok.gate.set()
    assert await first == [([1], False)]
    await asyncio.gather(*later)
    results = [t.result() for t in later]
    assert results == [[([i], i % 2 == 0)] for i in range(1, 5)]
    assert tok.calls == [[["a"]], [["b"], ["bb"], ["bbb"], ["bbbb"]]]
    assert queue.calls_total == 2 and queue.texts_total == 5
    assert queue.busy_s_total > 0
    assert all(name.startswith("tokenize") for name in tok.threads)  # off the event loop
    await queue.close()


async def test_a_second_call_starts_only_once_enough_texts_wait():
    tok = FakeTokenizer(gate=True)
    queue = TokenizeQueue(tok.encode_requests, threads=2, overlap_texts=4)
    first = asyncio.create_task(queue.encode(["a"], False))
    await tok.running()
    few = [asyncio.create_task(queue.encode([c], False)) for c in "bcd"]
    await asyncio.sleep(0.05)  # 3 texts wait: too few to start a second call
    assert queue.calls_total == 1 and not tok.entered.is_set()
    more = asyncio.create_task(queue.encode(["e", "f"], False))  # 5 >= 4: it starts
    await tok.running()
    assert queue.calls_total == 2
    tok.gate.set()
    await asyncio.gather(first, *few, more)
    assert sorted(map(len, tok.calls)) == [1, 4]  # one call of the lone first request
    await queue.close()


async def test_a_bad_request_fails_alone():
    tok = FakeTokenizer(gate=True)
    queue = TokenizeQueue(tok.encode_requests, threads=1)
    blocker = asyncio.create_task(queue.encode(["x"], False))
    await tok.running()
    good = asyncio.create_task(queue.encode(["ok"], False))
    bad = asyncio.create_task(queue.encode(["bad"], False))
    await asyncio.sleep(0)  # the new callers are queued
    tok.gate.set()
    await blocker
    assert await good == [([2], False)]
    with pytest.raises(InvalidRequestError, match="bad text"):
        await bad
    assert len(tok.calls) == 2  # good and bad went in one call
    await queue.close()


async def test_cancelled_callers_are_dropped_and_close_fails_the_rest():
    tok = FakeTokenizer(gate=True)
    queue = TokenizeQueue(tok.encode_requests, threads=1)
    running = asyncio.create_task(queue.encode(["1"], False))
    await tok.running()
    gone = asyncio.create_task(queue.encode(["2"], False))
    kept = asyncio.create_task(queue.encode(["3"], False))
    await asyncio.sleep(0)  # the new callers are queued
    gone.cancel()
    tok.gate.set()
    await running
    assert await kept == [([1], False)]
    assert tok.calls[1] == [["3"]]
    tok.gate.clear()
    tok.entered.clear()
    stuck = asyncio.create_task(queue.encode(["4"], False))
    await tok.running()
    waiting = asyncio.create_task(queue.encode(["5"], False))
    await asyncio.sleep(0)  # queued behind the running call
    closing = asyncio.create_task(queue.close())
    await asyncio.sleep(0)  # close() fails what waits, then waits for the running call
    tok.gate.set()
    await closing
    assert await stuck == [([1], False)]  # the call already running finishes
    with pytest.raises(RuntimeError, match="shutting down"):
        await waiting


async def test_a_failing_tokenizer_fails_every_request_of_its_call():
    def broken(requests):
        raise ValueError("tokenizer exploded")

    queue = TokenizeQueue(broken, threads=2)
    with pytest.raises(ValueError, match="exploded"):
        await queue.encode(["a"], False)
    await queue.close()


async def test_real_tokenizer_matches_direct_encoding(embedder):
    queue = TokenizeQueue(embedder.tokenizer.encode_requests)
    texts = [["Hello world"], ["A man is eating food.", "x"], ["lorem ipsum " * 200]]
    results = await asyncio.gather(*(queue.encode(t, True) for t in texts))
    assert results == [embedder.tokenize(t, truncate=True) for t in texts]
    with pytest.raises(InvalidRequestError) as info:
        await queue.encode(["fine", ""], False)
    assert info.value.param == "input" and "input[1]" in info.value.message
    await queue.close()


class BrokenAtSubmit(Executor):
    """An executor whose worker died while it was idle: it refuses every submission, as
    ``ProcessPoolExecutor`` does once its manager has seen the death."""

    def submit(self, fn, /, *args, **kwargs):
        raise BrokenExecutor("a child process terminated abruptly")


async def test_a_pool_broken_while_idle_is_replaced_before_the_call():
    tok = FakeTokenizer()
    replacements = []

    def replace() -> Executor:
        replacements.append(ThreadPoolExecutor(1, thread_name_prefix="tokenize"))
        return replacements[-1]

    queue = TokenizeQueue(tok.encode_requests, executor=BrokenAtSubmit(), replace_executor=replace)
    assert await queue.encode(["ab"], False) == [([2], False)]
    assert queue.executor_replacements == 1 and len(replacements) == 1
    assert await queue.encode(["abc"], True) == [([3], True)]  # the new pool serves on
    await queue.close()


async def test_with_nothing_to_replace_it_a_broken_pool_fails_its_requests_without_a_hang():
    tok = FakeTokenizer(gate=True)
    good = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
    queue = TokenizeQueue(tok.encode_requests, executor=good)
    first = asyncio.create_task(queue.encode(["a"], False))
    await tok.running()
    waiting = asyncio.create_task(queue.encode(["b"], False))  # joins the next call
    await asyncio.sleep(0)
    queue._executor = BrokenAtSubmit()  # its worker dies while the first call runs
    tok.gate.set()
    assert await first == [([1], False)]
    with pytest.raises(BrokenExecutor):
        await asyncio.wait_for(waiting, timeout=10)  # started from the first call's end
    with pytest.raises(BrokenExecutor):
        await queue.encode(["c"], False)  # started at once
    good.shutdown()
