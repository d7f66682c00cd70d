"""Start-up warm-up: the groups it serves, and an engine it leaves as a fresh one."""

from __future__ import annotations

import dataclasses

import pytest

from jacana_engine.sample.params import SamplingParams
from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.worker.warm_up import WARM_UP_GROUPS, WarmUpLimits, warm_up_requests

LIMITS = WarmUpLimits(
    vocab_size=1000, max_num_seqs=64, max_num_batched_tokens=2048, max_request_tokens=4096
)


def test_every_group_runs_within_roomy_limits_and_separates_the_sampling_paths():
    groups = dict(warm_up_requests(LIMITS))
    assert list(groups) == [name for name, _, _ in WARM_UP_GROUPS]
    plain = groups["plain draw"][0][1]
    filtered = groups["filtered draw"][0][1]
    assert plain.temperature > 0 and (plain.top_k, plain.top_p, plain.min_p) == (0, 1.0, 0.0)
    assert filtered.top_k > 0 and filtered.top_p < 1.0
    several = groups["filtered draws"]  # the filters' operators over several rows
    assert len(several) == 3 and all(sp == filtered for _, sp in several)
    many = groups["many prompts"]
    assert len(many) == 16 and max(len(p) for p, _ in many) == 1024
    assert sum(len(p) for p, _ in many) <= LIMITS.max_num_batched_tokens
    prompts = [tuple(p) for reqs in groups.values() for p, _ in reqs]
    assert len(set(prompts)) == len(prompts), "two groups share a prompt (a prefix-cache hit)"
    assert all(0 <= t < LIMITS.vocab_size for p in prompts for t in p)


@pytest.mark.parametrize(
    ("limits", "absent"),
    [
        (WarmUpLimits(1000, 1, 2048, 4096), {"filtered draws", "two prompts", "many prompts"}),
        (WarmUpLimits(1000, 64, 64, 4096), {"many prompts"}),  # budget: 15 short, no long
        (WarmUpLimits(1000, 64, 2048, 11), {"many prompts"}),  # its long prompt: 8 tokens
    ],
)
def test_groups_the_limits_cannot_hold_are_left_out(limits, absent):
    groups = dict(warm_up_requests(limits))
    assert set(groups) == {name for name, _, _ in WARM_UP_GROUPS} - absent
    for requests in groups.values():
        assert len(requests) <= limits.max_num_seqs
        assert sum(len(p) for p, _ in requests) <= limits.max_num_batched_tokens
        assert all(len(p) + sp.max_tokens <= limits.max_request_tokens for p, sp in requests)


def test_a_context_too_short_for_any_group_warms_nothing():
    assert warm_up_requests(WarmUpLimits(1000, 64, 2048, 8)) == []


def _traffic() -> tuple[list[list[int]], list[SamplingParams]]:
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14, 15, 16, 17, 18, 19], [3, 1, 4, 1, 5]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=5, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=5, max_tokens=6, ignore_eos=True),  # no seed
        SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True),  # no seed
    ]
    return prompts, params


def test_a_warmed_engine_serves_and_counts_exactly_as_a_fresh_one(toy):
    warmed = toy.engine(warm_up=True, seed=3)
    fresh = toy.engine(warm_up=False, seed=3)
    assert warmed.warm_up_seconds > 0 and fresh.warm_up_seconds == 0
    stats = warmed.stats()
    # the same counters (``recent`` holds its start time, which differs)
    assert dataclasses.replace(stats, recent=None) == dataclasses.replace(
        fresh.stats(), recent=None
    )
    assert stats.recent.buckets == ()
    assert stats.steps_total == 0 and stats.requests_finished_total == 0
    assert stats.kv_blocks_free == stats.kv_blocks_total and stats.kv_blocks_cached == 0
    # unseeded draws too: the warm-up took nothing from the engine's seed source
    assert warmed.generate(*_traffic()) == fresh.generate(*_traffic())
    after_w, after_f = warmed.stats(), fresh.stats()
    assert after_w.prompt_tokens_total == after_f.prompt_tokens_total > 0
    assert after_w.prefix_cache_hits_total == after_f.prefix_cache_hits_total


def test_warm_up_serves_real_steps_and_keeps_the_speculator(toy):
    spec = SpeculativeConfig(proposer="ngram", num_speculative_tokens=2, dynamic_k=False)
    engine = toy.engine(warm_up=False, speculative=spec)
    speculator = engine.speculator
    engine.warm_up()
    assert engine.speculator is speculator and engine.runner.speculator is speculator
    assert speculator.stats() == toy.engine(warm_up=False, speculative=spec).speculator.stats()
    assert engine.stats().steps_total == 0
    prompts, params = _traffic()
    assert len(engine.generate(prompts, params)[0]) == 6


def test_the_default_warms_up_on_cuda_only(toy):
    assert toy.engine().warm_up_seconds == 0  # CPU: off unless asked for


def test_warm_up_refuses_a_busy_engine_and_keeps_its_requests(toy):
    engine = toy.engine(warm_up=False)
    engine.add_request("live", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4))
    with pytest.raises(RuntimeError, match="idle"):
        engine.warm_up()
    assert engine.scheduler.get("live") is not None and engine.has_unfinished_requests()
