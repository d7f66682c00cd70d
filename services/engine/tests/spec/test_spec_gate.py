"""The engine-wide speculation gate: drafting pauses while it does not raise measured
decode throughput, and is measured again after a cooldown."""

from __future__ import annotations

import pytest
from spec_doubles import SlowWrongProposer

from jacana_engine.sample.params import SamplingParams
from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.gate import Phase, SpeculationGate
from jacana_engine.spec.speculator import Speculator

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _run(gate: SpeculationGate, steps: int, spec: tuple[float, float], plain: float) -> list:
    """Feed ``steps`` decode steps: (seconds, tokens per sequence) while drafting, else
    ``plain`` seconds for one token; returns the phase before each step."""
    phases = []
    for _ in range(steps):
        phases.append(gate.phase)
        if gate.drafts_allowed():
            gate.record(*spec)
        else:
            gate.record(plain, 1.0)
    return phases


def test_gate_stays_open_while_drafts_pay():
    gate = SpeculationGate(window=8, probe=4, cooldown=50, cruise=20, max_cruise=40)
    gate.record(0.001, 1.0, drafted=False)  # nothing drafted: not a sample of drafting
    assert gate.steps_in_phase == 0
    phases = _run(gate, 132, spec=(0.012, 2.5), plain=0.010)  # 208 vs 100 tokens/s
    assert gate.shut_total == 0 and Phase.SHUT not in phases
    # measure (8 + 4), then draft unmeasured for 20, 40, 40 steps: the longer it pays,
    # the rarer the plain probes
    runs = _runs(phases)
    assert runs == [
        (Phase.SPEC, 8), (Phase.PLAIN, 4), (Phase.CRUISE, 20),
        (Phase.SPEC, 8), (Phase.PLAIN, 4), (Phase.CRUISE, 40),
        (Phase.SPEC, 8), (Phase.PLAIN, 4), (Phase.CRUISE, 36),
    ]  # fmt: skip
    assert gate.phase is Phase.CRUISE and gate.steps_in_phase == 36
    gate.record(0.001, 1.0, drafted=False)  # cruising counts every decode step
    assert gate.steps_in_phase == 37


def _runs(phases: list) -> list[tuple]:
    """Consecutive equal phases as (phase, length) pairs."""
    runs: list[tuple] = []
    for phase in phases:
        if runs and runs[-1][0] is phase:
            runs[-1] = (phase, runs[-1][1] + 1)
        else:
            runs.append((phase, 1))
    return runs


def test_gate_shuts_when_drafts_cost_more_than_they_gain_and_measures_again():
    gate = SpeculationGate(window=8, probe=4, cooldown=50)
    phases = _run(gate, 12 + 50 + 12, spec=(0.030, 2.0), plain=0.010)  # 67 vs 100 (< 90)
    assert phases[:8] == [Phase.SPEC] * 8 and phases[8:12] == [Phase.PLAIN] * 4
    assert phases[12:62] == [Phase.SHUT] * 50  # plain speed for the cooldown
    assert phases[62:70] == [Phase.SPEC] * 8  # then it measures again
    assert gate.shut_total == 2


def test_undrafted_steps_between_drafted_ones_count_as_the_cost_of_drafting():
    # Plain steps overlap (10 ms); while drafting they cannot, so a step in which nobody
    # drafted costs 12 ms for one token. Drafted steps alone look as fast as plain ones
    # (1.2 tokens in 12 ms: 100 tokens/s); with the undrafted steps between them the
    # drafting engine gains 7.8 tokens in 84 ms (93 tokens/s), below the 0.97 margin.
    gate = SpeculationGate(window=4, probe=4, cooldown=50)
    gate.record(0.012, 1.0, drafted=False)  # before the first draft: no sample yet
    assert gate.steps_in_phase == 0
    for _ in range(3):
        gate.record(0.012, 1.2)
        gate.record(0.012, 1.0, drafted=False)
    gate.record(0.012, 1.2)
    assert gate.phase is Phase.PLAIN  # the fourth drafted step closed the sample
    for _ in range(4):
        gate.record(0.010, 1.0)
    assert gate.phase is Phase.SHUT and gate.shut_total == 1


def test_gate_cooldown_doubles_while_drafts_keep_losing_and_resets_when_they_pay():
    gate = SpeculationGate(window=4, probe=4, cooldown=20, max_cooldown=60)
    losing, paying = (0.030, 2.0), (0.012, 2.5)
    phases = _run(gate, 8 + 20 + 8 + 40 + 8 + 60 + 8 + 60, spec=losing, plain=0.010)
    shut_runs, run = [], 0
    for phase in [*phases, Phase.SPEC]:
        if phase is Phase.SHUT:
            run += 1
        elif run:
            shut_runs.append(run)
            run = 0
    assert shut_runs == [20, 40, 60, 60]  # doubled, then capped at max_cooldown
    assert gate.shut_streak == 4
    _run(gate, 8 + 60, spec=paying, plain=0.010)  # drafting pays again: streak resets
    assert gate.shut_streak == 0 and gate.current_cooldown == 20


def test_a_cruise_that_turns_slow_ends_early_and_the_gate_shuts():
    gate = SpeculationGate(window=4, probe=4, cruise=1000, cooldown=50, monitor=16)
    phases = _run(gate, 8, spec=(0.012, 2.5), plain=0.010)  # pays: 208 vs 100 tokens/s
    assert gate.phase is Phase.CRUISE
    # the text stops repeating: drafting now gains 1.2 tokens in 20 ms (60 vs 100 tokens/s)
    phases += _run(gate, 16 + 4 + 50, spec=(0.020, 1.2), plain=0.010)
    assert _runs(phases) == [
        (Phase.SPEC, 4), (Phase.PLAIN, 4), (Phase.CRUISE, 16),  # not 1000: the monitor
        (Phase.PLAIN, 4), (Phase.SHUT, 50),  # re-probed plain, judged the cruise: shut
    ]  # fmt: skip
    assert gate.cruise_checks_failed == 1 and gate.shut_total == 1


def test_a_cruise_that_still_pays_is_not_interrupted():
    gate = SpeculationGate(window=4, probe=4, cruise=100, monitor=16)
    phases = _run(gate, 8 + 100, spec=(0.0101, 1.0), plain=0.010)  # 99% of plain: noise
    assert _runs(phases) == [(Phase.SPEC, 4), (Phase.PLAIN, 4), (Phase.CRUISE, 100)]
    assert gate.cruise_checks_failed == 0


def test_a_shut_gate_measures_again_once_the_batch_has_turned_over():
    gate = SpeculationGate(window=4, probe=4, cooldown=1000)
    for _ in range(8):  # measure with requests a and b: drafting loses
        allowed = gate.drafts_allowed(["a", "b"])
        gate.record(0.030, 2.0) if allowed else gate.record(0.010, 1.0)
    assert gate.phase is Phase.SHUT
    assert not gate.drafts_allowed(["b", "c"])  # b was measured: still shut
    assert gate.drafts_allowed(["c", "d"])  # nobody measured is left: measure again
    assert gate.phase is Phase.SPEC and gate.shut_streak == 1


def test_a_large_batch_turning_over_waits_for_the_cooldown():
    gate = SpeculationGate(window=4, probe=4, cooldown=1000, turnover_batch=4)
    first, second = [f"a{i}" for i in range(8)], [f"b{i}" for i in range(8)]
    for _ in range(8):
        allowed = gate.drafts_allowed(first)
        gate.record(0.030, 2.0) if allowed else gate.record(0.010, 1.0)
    assert gate.phase is Phase.SHUT
    assert not gate.drafts_allowed(second)  # 8 new requests: the cost decides, still shut


def test_engine_pauses_speculation_that_does_not_pay(toy):
    cfg = SpeculativeConfig(proposer="ngram", num_speculative_tokens=4, dynamic_k=True)
    engine = toy.engine(speculative=cfg)
    proposer = SlowWrongProposer(toy.LM.VOCAB)
    engine.speculator = engine.runner.speculator = Speculator(cfg, proposer)
    gate = engine.speculator.gate
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    sp = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
    assert engine.generate([prompt], sp) == [toy.greedy(prompt, 80)]
    s = engine.stats().speculative["slow-wrong"]
    assert s.proposals > 0 and s.draft_tokens > 0 and s.accepted_tokens == 0
    assert gate.shut_total >= 1 and gate.phase is Phase.SHUT
    # the first window proposed; then the per-request back-off and the gate kept it quiet
    assert 1 <= proposer.calls <= gate.window + 2
