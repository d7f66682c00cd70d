"""GPU time of queued work (a captured CUDA graph, a kernel launch), read from the
device's clock."""

from __future__ import annotations

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
