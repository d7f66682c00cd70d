"""Engine statistics: the snapshot handed to other threads, and the throughput meter.

Ownership: ``LLMEngine`` owns one :class:`ThroughputMeter` (host-side; the engine thread
records into it once per step) and builds an :class:`EngineStats` on demand. A snapshot
is frozen plain data, safe to read from any thread. It carries the meter's per-second
buckets rather than a finished rate, so a rate is computed when it is read: a snapshot
taken just before the engine went idle then decays to zero instead of reporting its last
busy rate forever (``AsyncEngine`` refreshes its snapshot only when the engine works).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from jacana_engine.spec.acceptance import ProposerStats

WINDOW_S = 10  # seconds of history behind the recent-throughput rates


@dataclass(frozen=True)
class RecentThroughput:
    """Tokens per whole second of the clock over the last ``window_s`` seconds.

    buckets: ``(second, prompt tokens, generation tokens)``, oldest first; seconds are
        ``floor`` of ``time.monotonic()``.
    started_at: when the meter started; a younger engine divides by its age instead.
    """

    started_at: float = 0.0
    buckets: tuple[tuple[int, int, int], ...] = ()
    window_s: int = WINDOW_S

    def rates(self, now: float | None = None) -> tuple[float, float]:
        """``(prompt tokens/s, generation tokens/s)`` over the window ending at ``now``.

        The window spans the current partial second and the ``window_s - 1`` whole seconds
        before it; the divisor is at least one second, so a first burst is not inflated.
        """
        now = time.monotonic() if now is None else now
        first = math.floor(now) - self.window_s + 1
        span = max(1.0, min(now - first, now - self.started_at))
        prompt = sum(b[1] for b in self.buckets if first <= b[0] <= now)
        generation = sum(b[2] for b in self.buckets if first <= b[0] <= now)
        return prompt / span, generation / span


class ThroughputMeter:
    """Counts computed prompt tokens and sampled tokens into one-second buckets.

    Not thread-safe: one thread records; :meth:`snapshot` hands out frozen copies.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, window_s: int = WINDOW_S
    ) -> None:
        if window_s < 1:
            raise ValueError(f"window_s must be >= 1, got {window_s}")
        self._clock = clock
        self.window_s = window_s
        self.started_at = clock()
        self._buckets: deque[list[int]] = deque()  # [second, prompt, generation]

    def record(self, prompt_tokens: int, generation_tokens: int) -> None:
        second = math.floor(self._clock())
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += prompt_tokens
            self._buckets[-1][2] += generation_tokens
        else:
            self._buckets.append([second, prompt_tokens, generation_tokens])
        while self._buckets[0][0] <= second - self.window_s:
            self._buckets.popleft()

    def snapshot(self) -> RecentThroughput:
        return RecentThroughput(
            self.started_at, tuple((s, p, g) for s, p, g in self._buckets), self.window_s
        )


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's queues, KV pool, prefix cache and counters.

    kv_blocks_free: blocks no request owns, ``kv_blocks_cached`` of them still holding a
        reusable prefix (reallocated least recently used first when the pool runs short).
    prompt_tokens_total: prompt tokens computed for requests' first prefill (prefix-cache
        hits are not computed, so not counted; recomputation after preemption is not).
    prefix_cache_queries_total / prefix_cache_hits_total: tokens of admitted requests
        looked up in the prefix cache, and of those the ones found cached.
    recent: the last seconds' throughput; read it with :meth:`prompt_tokens_per_s` and
        :meth:`generation_tokens_per_s`.
    speculative: per proposer name, its draft counters (proposals, draft/accepted tokens,
        ``acceptance_rate``, ``mean_accepted_length``); empty without speculation.
    step_seconds_total: wall seconds spent by the steps that ran, per part: ``schedule``
        (drafting and scheduling), ``execute`` (the forward pass and sampling, until the
        tokens are on the host: on a GPU this includes waiting for it) and ``outputs``
        (appending tokens, detokenizing, stop checks, verification commits). An
        overlapped decode step (``decode_overlap.py``) counts its launch as ``execute``
        and the wait for the step before it, read back after that launch, as ``outputs``.
    """

    num_running: int
    num_waiting: int
    kv_blocks_total: int
    kv_blocks_free: int
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_finished_total: int
    steps_total: int
    preemptions_total: int
    kv_blocks_cached: int = 0
    prefix_cache_queries_total: int = 0
    prefix_cache_hits_total: int = 0
    recent: RecentThroughput = field(default_factory=RecentThroughput)
    speculative: Mapping[str, ProposerStats] = field(default_factory=dict)
    step_seconds_total: Mapping[str, float] = field(default_factory=dict)
    overlapped_steps_total: int = 0  # decode steps launched before the previous one's tokens

    @property
    def kv_blocks_used(self) -> int:
        return self.kv_blocks_total - self.kv_blocks_free

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of looked-up tokens served from the cache since start (0 before any)."""
        if not self.prefix_cache_queries_total:
            return 0.0
        return self.prefix_cache_hits_total / self.prefix_cache_queries_total

    def prompt_tokens_per_s(self, now: float | None = None) -> float:
        return self.recent.rates(now)[0]

    def generation_tokens_per_s(self, now: float | None = None) -> float:
        return self.recent.rates(now)[1]
