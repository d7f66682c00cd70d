"""Small host-built tensors sent to the device behind the kernels already queued.

A copy from pageable host memory makes the CUDA stream finish everything queued before
it, so the host waits there for the step's forward and only then queues what follows
(the gathers, lm_head and sampling after a prefill). From pinned memory the copy is
queued like a kernel and the host goes on launching.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(values: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``values`` (a CPU tensor) on ``device``: on CUDA through pinned memory, without
    waiting for the device (torch's pinned-memory cache keeps the buffer until the copy
    has run)."""
    device = torch.device(device)
    if device.type != "cuda":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)


def index_on(rows: Sequence[int], device: torch.device | str) -> torch.Tensor:  # [len(rows)] int64
    """Row indices for ``tensor[index]`` on ``device`` (see :func:`to_device`)."""
    return to_device(torch.tensor(rows, dtype=torch.int64), device)
