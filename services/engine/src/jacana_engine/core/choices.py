"""``n`` choices of one request, as ``n`` engine requests merged into one stream.

The engine core schedules sequences, not choices: choice ``i`` of request ``r`` is the
engine request ``choice_request_id(r, i, n)`` with :func:`choice_params` (with a seed,
choice i samples with ``seed + i``, so choice 0 is what the same request with n=1 gives).

KV sharing: choice 0 runs first; the other choices are added once it has produced its
first token, when its prompt blocks are computed and committed to the prefix cache, so
they start from those shared blocks and compute only the unshared tail of the prompt
(without prefix caching they recompute the prompt). Prompt logprobs are computed by
choice 0 alone and handed to every choice's first output.

State: nothing beyond one call: the caller's event loop runs one task per choice that
forwards its outputs into a queue. Closing the iterator (or an error in any choice)
cancels every task, which aborts each unfinished choice inside the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.core.outputs import RequestOutput
from jacana_engine.sample.params import SamplingParams

MAX_SEED = 2**64  # seeds are unsigned 64-bit on the wire; seed + i wraps around
MAX_CHOICES = 128  # most choices one request may ask for (the gateway's bound too)


class Generates(Protocol):
    """What the fan-out needs of the engine (``AsyncEngine`` satisfies it)."""

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        **options: Any,
    ) -> AsyncIterator[RequestOutput]: ...


def choice_request_id(request_id: str, index: int, n: int) -> str:
    """The engine request id of choice ``index``; a single choice keeps the caller's id."""
    return request_id if n == 1 else f"{request_id}#{index}"


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index``'s parameters: seed + index, prompt logprobs on choice 0 only."""
    changes: dict = {}
    if params.seed is not None:
        changes["seed"] = (params.seed + index) % MAX_SEED
    if index > 0:
        changes["prompt_logprobs"] = None
    return dataclasses.replace(params, **changes) if changes else params


async def generate_choices(
    engine: Generates,
    request_id: str,
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    n: int,
    **options: Any,
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Stream ``(choice index, output)`` pairs of ``n`` choices until all have finished.

    ``options`` (priority, cache salt, ...) go to every choice's ``engine.generate``.
    Raises :class:`InvalidRequestError` for a bad ``n``, and what the engine raises for
    choice 0 (an invalid request), before any output.
    """
    if not 1 <= n <= MAX_CHOICES:
        raise InvalidRequestError(f"n must be in [1, {MAX_CHOICES}], got {n}", "n")
    prompt = list(prompt_token_ids)
    if n == 1:
        async for out in engine.generate(request_id, prompt, params, **options):
            yield 0, out
        return

    queue: asyncio.Queue = asyncio.Queue()
    first_done = asyncio.Event()
    prompt_logprobs: list = []

    async def run(index: int) -> None:
        rid = choice_request_id(request_id, index, n)
        first = True
        try:
            if index > 0:
                await first_done.wait()
            async for out in engine.generate(rid, prompt, choice_params(params, index), **options):
                if first and index == 0 and out.prompt_logprobs is not None:
                    prompt_logprobs.extend(out.prompt_logprobs)
                if first and index > 0 and params.prompt_logprobs is not None:
                    out = dataclasses.replace(out, prompt_logprobs=list(prompt_logprobs))
                first = False
                queue.put_nowait((index, out))
                if index == 0:
                    first_done.set()
        except Exception as exc:  # handed to the consumer, who cancels the rest
            queue.put_nowait((index, exc))
        finally:
            first_done.set()  # never leave the others waiting on a choice 0 that failed

    tasks = [asyncio.create_task(run(i)) for i in range(n)]
    try:
        unfinished = n
        while unfinished:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                unfinished -= 1
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
