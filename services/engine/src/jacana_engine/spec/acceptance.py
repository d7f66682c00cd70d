"""Per-request dynamic k and per-proposer acceptance counters (host-side, engine thread).

Dynamic k. Each request keeps an exponential moving average ``rate`` of the fraction of
its drafted tokens the target accepted. With a per-token acceptance rate a, the j-th draft
token is used with probability about a**j, so drafting it pays only while a**j stays above
``min_gain`` (its share of a verification step's cost). k is the largest such j, capped at
the configured maximum; when even the first token does not pay, the request stops
drafting (k = 0) and probes again with one token every ``probe_interval`` steps, so a
request whose text turns repetitive picks speculation back up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EMA_WEIGHT = 0.3  # weight of the newest step in the running acceptance rate


@dataclass
class AcceptanceTracker:
    """One request's running acceptance and the k it drafts next."""

    max_k: int
    dynamic: bool = True
    min_gain: float = 0.2
    probe_interval: int = 8
    rate: float = 1.0  # optimistic start: draft the full k until evidence says otherwise
    idle_steps: int = 0

    def next_k(self) -> int:
        """Draft length for the next step (0 = do not draft)."""
        if not self.dynamic or self.max_k == 0:
            return self.max_k
        k = self._k_for_rate(self.rate)
        if k > 0:
            return k
        self.idle_steps += 1
        if self.idle_steps >= self.probe_interval:
            self.idle_steps = 0
            return 1
        return 0

    def _k_for_rate(self, rate: float) -> int:
        if rate >= 1.0:
            return self.max_k
        if rate <= 0.0:
            return 0
        # largest j with rate**j >= min_gain
        return min(self.max_k, int(math.log(self.min_gain) / math.log(rate) + 1e-9))

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """A verification of ``num_drafted`` tokens accepted ``num_accepted`` of them."""
        if num_drafted <= 0:
            return
        step_rate = num_accepted / num_drafted
        self.rate = (1 - EMA_WEIGHT) * self.rate + EMA_WEIGHT * step_rate


@dataclass(frozen=True)
class ProposerStats:
    """Counters of one proposer since start-up.

    proposals: verification steps that checked a non-empty draft.
    draft_tokens: tokens drafted and verified.
    accepted_tokens: drafted tokens the target accepted.
    """

    proposals: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 before any draft)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens gained per verification step: accepted drafts + the target's own token."""
        return 1.0 + self.accepted_tokens / self.proposals if self.proposals else 0.0

    def add(self, num_drafted: int, num_accepted: int) -> ProposerStats:
        return ProposerStats(
            self.proposals + 1,
            self.draft_tokens + num_drafted,
            self.accepted_tokens + num_accepted,
        )
