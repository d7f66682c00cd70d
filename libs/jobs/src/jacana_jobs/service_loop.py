"""What a job service runs beside its RPCs: the periodic sweep of expired jobs' files."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


async def sweep_forever(sweep: Callable[[], int], interval_s: float, what: str) -> None:
    """Call ``sweep`` (blocking; returns how many jobs it swept) on a thread until it finds
    nothing, then wait ``interval_s``; forever. A failure (Redis down) is logged and tried
    again at the next turn. Cancel the task to stop it."""
    while True:
        try:
            while await asyncio.to_thread(sweep) > 0:
                pass
        except Exception:
            log.exception("sweeping expired %s failed", what)
        await asyncio.sleep(interval_s)
