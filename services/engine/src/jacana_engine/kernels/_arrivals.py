"""Arrival counters for kernels whose last program to finish completes the job (merges
split partials, normalizes whole rows): each program bumps a counter after storing its
share, and the one that arrives last does the rest and resets the counter to 0.

The counters are persistent int32 device buffers, all zeros between launches, one list
per (kernel family, device). A larger need appends a larger buffer and keeps the old
ones alive: captured CUDA graphs still address them. Launches that share a family's
buffer must be stream-ordered, not concurrent.
"""

from __future__ import annotations

import torch

MIN_COUNTERS = 4096  # 16 KiB: e.g. 512 sequences x 8 KV heads

# (family, device) -> buffers, the last one current
_held: dict[tuple[str, torch.device], list[torch.Tensor]] = {}


def arrival_counters(family: str, device: torch.device, count: int) -> torch.Tensor:
    """The zeroed counters of ``family`` on ``device``, at least ``count`` of them. Grows
    outside CUDA-graph capture only (a warm-up call at the same size before a capture
    sizes it); raises ``RuntimeError`` if it would have to grow during one."""
    held = _held.setdefault((family, device), [])
    if not held or held[-1].numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{family} needs {count} arrival counters while capturing a CUDA graph; "
                "run it once at this size before the capture"
            )
        held.append(torch.zeros(max(count, MIN_COUNTERS), dtype=torch.int32, device=device))
    return held[-1]


def held_counters(family: str, device: torch.device) -> list[torch.Tensor]:
    """Every buffer ``family`` has had on ``device``, oldest first (for checks)."""
    return list(_held.get((family, device), []))
