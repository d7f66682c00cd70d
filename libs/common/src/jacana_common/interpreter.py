"""Interpreter tuning for service processes, applied once at start-up from settings."""

from __future__ import annotations

import sys


def set_gil_switch_interval(microseconds: int) -> None:
    """Bound how long a thread running Python keeps the GIL while another thread waits.

    Why: a model thread (the engine's step loop, the embeddings batcher) releases the GIL
    inside every torch call and must win it back afterwards. When the event loop or a
    tokenizer thread is running Python at that moment, CPython lets it keep the GIL for up
    to the switch interval (5 ms by default) first, so a forward pass of a hundred kernel
    launches can spend most of its time waiting. A short interval bounds each wait.
    ``0`` keeps the interpreter's default.
    """
    if microseconds < 0:
        raise ValueError(f"the GIL switch interval must be >= 0, got {microseconds}")
    if microseconds:
        sys.setswitchinterval(microseconds / 1e6)
