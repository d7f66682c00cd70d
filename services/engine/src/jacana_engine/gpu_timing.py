"""GPU time of captured CUDA graphs, read from the device's clock."""

from __future__ import annotations

import torch


def replay_seconds(graph: torch.cuda.CUDAGraph, replays: int = 1) -> float:
    """Seconds of GPU time per replay of ``graph``: ``replays`` replays between two CUDA
    events (the device's clock, not the host's); waits for them to finish."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / replays
