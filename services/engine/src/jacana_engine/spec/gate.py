"""Engine-wide speculation gate: draft only while drafting raises decode throughput.

Per-request dynamic k (``acceptance.py``) knows how often drafts are accepted, not what a
speculative step costs. That cost is the machine's: on a GPU a tiny target's step is
mostly host work, and proposing, verifying k + 1 positions and committing can cost more
than the accepted drafts save, however well they are accepted. So the gate measures it.

Decode steps (no prefill chunk) go through phases:
- ``SPEC`` (until ``window`` steps have verified drafts): proposers run. The sample starts
  at the first step that verified a draft (before it, nothing is known about drafting)
  and from there counts every step, drafted or not: a drafting engine cannot run its
  steps overlapped (``decode_overlap.py``), so a step in which nobody drafted still costs
  more than a plain one, and that is part of what drafting costs.
- ``PLAIN`` (``probe`` steps): nobody drafts (the steps may overlap).
- then the gate compares the two phases' throughputs: tokens gained per sequence over the
  phase's summed wall time (propose + forward + commit). A sum weighs each step by its
  time, as the clock does; a median of per-step rates would let cheap drafted steps
  outvote the costly undrafted ones between them. Unless drafting was clearly slower
  (below ``margin`` times the plain rate: timing noise must not shut it) it keeps
  drafting unmeasured (``CRUISE``) for a while before measuring again; else it stays
  ``SHUT`` (nobody drafts) for a cooldown of decode steps and then measures again (the
  batch, the text and the proposer's luck change).
- While cruising, the gate still times every step: whenever ``monitor`` cruise steps in
  a row gained less than ``margin`` times the last plain rate, the short verdict was
  luck (or the text stopped repeating), and the cruise ends early: those steps stand as
  the drafting sample, ``probe`` plain steps are measured afresh, and the gate decides
  again. A cruise that turns sour costs ``monitor`` steps, not its length.
Each verdict in a row doubles how long it holds: a cruise from ``cruise`` up to
``max_cruise`` decode steps, a cooldown from ``cooldown`` up to ``max_cooldown``. So
measuring costs little either way: while drafting pays, ``probe`` plain steps per
cruise; while it does not, a window costs about ``window * (1 / ratio - 1)`` plain steps
(ratio: drafting's speed relative to plain), e.g. ~4 at 0.5x, per cooldown.

What drafting gains depends on the text as much as on the machine. In a small batch
(at most ``turnover_batch`` requests) the text decides, so a shut gate measures again
once none of the requests it measured is still decoding: each new request gets its own
measurement instead of inheriting the pause of a previous one whose text did not
repeat. In a large batch the cost of a drafting step decides, and the many requests
would turn the batch over often, so there only the cooldown reopens the gate.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    SPEC = "spec"  # drafting, measured
    PLAIN = "plain"  # not drafting, measured
    CRUISE = "cruise"  # drafting, after a verdict that it pays
    SHUT = "shut"  # not drafting, after a verdict that it does not


@dataclass
class SpeculationGate:
    """``drafts_allowed()`` before a step, ``record(...)`` after each decode step."""

    window: int = 4
    probe: int = 4
    cruise: int = 64
    max_cruise: int = 1024
    cooldown: int = 256
    max_cooldown: int = 4096
    margin: float = 0.97
    monitor: int = 16
    turnover_batch: int = 4
    phase: Phase = Phase.SPEC
    steps_in_phase: int = 0
    shut_total: int = 0  # times the gate shut since start-up
    shut_streak: int = 0  # shuts since drafting last paid
    pay_streak: int = 0  # verdicts that drafting pays since it last did not
    _spec: _Throughput = field(default_factory=lambda: _Throughput())
    _spec_drafted: int = 0  # steps of the drafting sample that verified drafts
    _plain: _Throughput = field(default_factory=lambda: _Throughput())
    _cruise: _Throughput = field(default_factory=lambda: _Throughput())
    _plain_reference: float = 0.0  # plain rate of the latest verdict
    cruise_checks_failed: int = 0  # cruises ended early by the monitor since start-up
    _measured: set[str] = field(default_factory=set)  # requests seen while measuring

    def drafts_allowed(self, request_ids: Iterable[str] = ()) -> bool:
        """Whether the coming step may draft; ``request_ids``: the decoding requests."""
        if self.phase is Phase.SHUT:
            ids = set(request_ids)
            small = 0 < len(ids) <= self.turnover_batch
            if small and ids.isdisjoint(self._measured):  # a small batch turned over
                self._enter(Phase.SPEC)
        elif self.phase is not Phase.CRUISE:
            self._measured.update(request_ids)
        return self.phase in (Phase.SPEC, Phase.CRUISE)

    def record(self, seconds: float, tokens_per_sequence: float, drafted: bool = True) -> None:
        """One decode step's wall time, the tokens it gained per sequence (1 for a step
        without drafts) and whether it verified any draft."""
        if seconds <= 0:
            return
        if self.phase is Phase.SPEC and not (drafted or self._spec_drafted):
            return  # nothing drafted yet: no sample of drafting has begun
        self.steps_in_phase += 1
        if self.phase is Phase.SPEC:
            self._spec.add(tokens_per_sequence, seconds)
            self._spec_drafted += drafted
            if self._spec_drafted >= self.window:
                self._enter(Phase.PLAIN)
        elif self.phase is Phase.PLAIN:
            self._plain.add(1.0, seconds)
            if self.steps_in_phase >= self.probe:
                self._decide()
        elif self.phase is Phase.CRUISE and self._cruise_turned_sour(tokens_per_sequence, seconds):
            return
        elif self.steps_in_phase >= self._hold():
            self._enter(Phase.SPEC)

    def _cruise_turned_sour(self, tokens: float, seconds: float) -> bool:
        """Add a cruise step; after every ``monitor`` of them, end the cruise (measure
        plain steps again, with these as the drafting sample) if their throughput fell
        below the margin. True when it ended the cruise."""
        self._cruise.add(tokens, seconds)
        if self._cruise.steps < self.monitor:
            return False
        recent, self._cruise = self._cruise, _Throughput()
        if recent.rate >= self.margin * self._plain_reference:
            return False
        self.cruise_checks_failed += 1
        self._enter(Phase.SPEC)
        self._spec, self._spec_drafted = recent, self.window
        self._enter(Phase.PLAIN)
        return True

    @property
    def current_cooldown(self) -> int:
        """Decode steps the gate stays shut after its latest shut."""
        return _doubled(self.cooldown, self.shut_streak, self.max_cooldown)

    @property
    def current_cruise(self) -> int:
        """Decode steps the gate drafts unmeasured after its latest verdict that it pays."""
        return _doubled(self.cruise, self.pay_streak, self.max_cruise)

    def _hold(self) -> int:
        return self.current_cruise if self.phase is Phase.CRUISE else self.current_cooldown

    def _decide(self) -> None:
        spec = self._spec.rate
        plain = self._plain_reference = self._plain.rate
        if spec >= self.margin * plain:
            self.shut_streak = 0
            self.pay_streak += 1
            self._enter(Phase.CRUISE)
            return
        self.shut_total += 1
        self.shut_streak += 1
        self.pay_streak = 0
        log.info(
            "speculation paused for %d decode steps: %.1f tokens/s per sequence with "
            "drafts vs %.1f without",
            self.current_cooldown,
            spec,
            plain,
        )
        self._enter(Phase.SHUT)

    def _enter(self, phase: Phase) -> None:
        if phase is Phase.SPEC:
            self._spec, self._spec_drafted = _Throughput(), 0
            self._plain = _Throughput()
            self._measured.clear()
        self._cruise = _Throughput()
        self.phase = phase
        self.steps_in_phase = 0


@dataclass
class _Throughput:
    """Tokens per sequence gained over a run of steps, and the steps' summed wall time."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def add(self, tokens: float, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.steps += 1

    @property
    def rate(self) -> float:
        """Tokens per second per sequence (0 for an empty run)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _doubled(base: int, streak: int, cap: int) -> int:
    """``base`` doubled for each verdict in a row after the first, at most ``cap``."""
    return min(cap, base << min(max(0, streak - 1), 30))
