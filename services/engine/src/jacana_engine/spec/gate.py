"""Engine-wide speculation gate: draft only while drafting raises decode throughput.

Per-request dynamic k (``acceptance.py``) knows how often drafts are accepted, not what a
speculative step costs. That cost is the machine's: on a GPU a tiny target's step is
mostly host work, and proposing, verifying k + 1 positions and committing can cost more
than the accepted drafts save, however well they are accepted. So the gate measures it.

Decode steps (no prefill chunk) go through phases:
- ``SPEC`` (``window`` steps that verified drafts; steps where nothing was drafted say
  nothing and are not counted): proposers run; each step's rate is the tokens it gained
  per sequence over its wall time (propose + forward + commit).
- ``PLAIN`` (``probe`` steps): nobody drafts; the rate is one token per sequence over the
  step's wall time.
- then the gate compares the two phases' median rates. Unless drafting was clearly slower
  (below ``margin`` times the plain rate: timing noise must not shut it) it keeps
  drafting unmeasured (``CRUISE``) for a while before measuring again; else it stays
  ``SHUT`` (nobody drafts) for a cooldown of decode steps and then measures again (the
  batch, the text and the proposer's luck change).
- While cruising, the gate still keeps every step's rate: whenever ``monitor`` cruise
  steps in a row have a median below ``margin`` times the last plain rate, the four-step
  verdict was luck (or the text stopped repeating), and the cruise ends early: those
  steps stand as the drafting sample, ``probe`` plain steps are measured afresh, and the
  gate decides again. A cruise that turns sour costs ``monitor`` steps, not its length.
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
import statistics
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
    _spec_rates: list[float] = field(default_factory=list)
    _plain_rates: list[float] = field(default_factory=list)
    _cruise_rates: list[float] = field(default_factory=list)
    _plain_reference: float = 0.0  # median plain rate of the latest verdict
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
        if seconds <= 0 or (self.phase is Phase.SPEC and not drafted):
            return
        self.steps_in_phase += 1
        if self.phase is Phase.SPEC:
            self._spec_rates.append(tokens_per_sequence / seconds)
            if self.steps_in_phase >= self.window:
                self._enter(Phase.PLAIN)
        elif self.phase is Phase.PLAIN:
            self._plain_rates.append(1.0 / seconds)
            if self.steps_in_phase >= self.probe:
                self._decide()
        elif self.phase is Phase.CRUISE and self._cruise_turned_sour(tokens_per_sequence / seconds):
            return
        elif self.steps_in_phase >= self._hold():
            self._enter(Phase.SPEC)

    def _cruise_turned_sour(self, rate: float) -> bool:
        """Keep a cruise step's rate; after every ``monitor`` of them, end the cruise
        (measure plain steps again, with these as the drafting sample) if their median
        fell below the margin. True when it ended the cruise."""
        self._cruise_rates.append(rate)
        if len(self._cruise_rates) < self.monitor:
            return False
        recent = statistics.median(self._cruise_rates)
        self._cruise_rates.clear()
        if recent >= self.margin * self._plain_reference:
            return False
        self.cruise_checks_failed += 1
        self._enter(Phase.SPEC)
        self._spec_rates.append(recent)
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
        spec = statistics.median(self._spec_rates)
        plain = self._plain_reference = statistics.median(self._plain_rates)
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
            self._spec_rates.clear()
            self._plain_rates.clear()
            self._measured.clear()
        self._cruise_rates.clear()
        self.phase = phase
        self.steps_in_phase = 0


def _doubled(base: int, streak: int, cap: int) -> int:
    """``base`` doubled for each verdict in a row after the first, at most ``cap``."""
    return min(cap, base << min(max(0, streak - 1), 30))
