"""Engine statistics: recent-window throughput that decays when idle, pool and cache facts."""

from __future__ import annotations

import pytest

from jacana_engine.core.stats import RecentThroughput, ThroughputMeter
from jacana_engine.sample.params import SamplingParams


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_rates_cover_the_last_window_and_decay_to_zero_when_idle():
    clock = FakeClock(100.0)
    meter = ThroughputMeter(clock, window_s=10)
    for _ in range(40):  # 20 s of work: 50 prompt + 10 generated tokens every half second
        clock.now += 0.5
        meter.record(50, 10)
    snap = meter.snapshot()
    assert len(snap.buckets) <= 10  # older seconds are dropped as it goes
    prompt, gen = snap.rates(clock.now)
    assert prompt == pytest.approx(100.0, rel=0.15) and gen == pytest.approx(20.0, rel=0.15)
    # The same frozen snapshot, read later with no work since: the rate falls to zero.
    assert snap.rates(clock.now + 5)[1] < gen * 0.7
    assert snap.rates(clock.now + 11) == (0.0, 0.0)


def test_a_young_engine_divides_by_its_age_but_at_least_a_second():
    snap = RecentThroughput(started_at=100.0, buckets=((100, 0, 30), (101, 0, 30)))
    assert snap.rates(102.0)[1] == pytest.approx(30.0)
    assert RecentThroughput(100.0, ((100, 0, 30),)).rates(100.2)[1] == pytest.approx(30.0)
    assert RecentThroughput().rates(5.0) == (0.0, 0.0)


def test_engine_stats_report_pool_cache_and_throughput(toy):
    engine = toy.engine(num_kv_blocks=32)
    sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    prompt = list(range(1, 22))
    engine.add_request("a", prompt, sp)
    for _ in range(3):
        engine.step()
    s = engine.stats()
    assert (s.num_running, s.num_waiting) == (1, 0)
    assert s.kv_blocks_used == 6 and s.kv_blocks_free == 26  # 23 slots -> 6 blocks
    assert s.generation_tokens_per_s() > 0 and s.prompt_tokens_per_s() > 0
    while engine.has_unfinished_requests():
        engine.step()
    s = engine.stats()
    # 30 computed tokens of "a" (the last sampled one never is) fill 7 blocks, kept cached.
    assert s.kv_blocks_free == 32 and s.kv_blocks_cached == 7 and s.num_running == 0
    engine.generate([prompt], sp)
    s = engine.stats()
    assert s.prefix_cache_hits_total == 20 and s.prefix_cache_hit_rate == pytest.approx(20 / 42)
    assert s.requests_finished_total == 2
    assert set(s.step_seconds_total) == {"schedule", "execute", "outputs"}
    assert all(seconds > 0 for seconds in s.step_seconds_total.values())
