"""GPU time of queued work (a captured CUDA graph, a kernel launch), read from the
device's clock."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def call_seconds(call: Callable[[], object], calls: int = 1) -> float:
    """Seconds of GPU time per ``call()`` (which only queues GPU work): ``calls`` calls
    between two CUDA events (the device's clock, not the host's); waits for them."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def replay_seconds(graph: torch.cuda.CUDAGraph, replays: int = 1) -> float:
    """Seconds of GPU time per replay of ``graph`` (:func:`call_seconds`)."""
    return call_seconds(graph.replay, replays)


def sustained_replay_seconds(
    graph: torch.cuda.CUDAGraph, seconds: float, tail: float = 0.4, batch: int = 10
) -> float:
    """Seconds of GPU time per replay of ``graph`` replayed back to back for ``seconds``
    of wall clock (in timed batches of ``batch`` replays), over the batches that end in
    its last ``tail`` share: the pace once the card has settled into the power and clock
    state that this work holds it at (an H200 at batch-1 decode reaches its power cap
    within about half a second and lowers its SM clock)."""
    batches: list[tuple[float, float]] = []  # (when it ended, seconds a replay)
    start = time.perf_counter()
    while not batches or time.perf_counter() - start < seconds:
        per_replay = replay_seconds(graph, batch)
        batches.append((time.perf_counter() - start, per_replay))
    settled = [s for end, s in batches if end >= (1 - tail) * seconds] or [batches[-1][1]]
    return sum(settled) / len(settled)
