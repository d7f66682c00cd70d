"""Speculative decoding inside the engine, on the toy model (exact, fast): verification in
the flattened batch, KV rollback, draft-length edge cases, opt-out, dynamic k, stats."""

from __future__ import annotations

import random

import pytest

from jacana_engine.core.outputs import FinishReason
from jacana_engine.sample.params import SamplingParams
from jacana_engine.spec.acceptance import ProposerStats
from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.proposer import Proposer
from jacana_engine.spec.speculator import Speculator

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class OracleProposer(Proposer):
    """Drafts the toy model's true greedy continuation, corrupted at chosen offsets, and
    ignores ``max_draft`` (the speculator must cap it)."""

    name = "oracle"

    def __init__(self, toy_lm, length=6, wrong_at=(), seed=0):
        self.toy_lm, self.length, self.wrong_at = toy_lm, length, set(wrong_at)
        self.rng = random.Random(seed)
        self.finished: list[str] = []

    def propose(self, requests):
        out = []
        for r in requests:
            draft = self.toy_lm.greedy(list(r.token_ids), self.length)
            for j in self.wrong_at:
                if j < len(draft):
                    draft[j] = (draft[j] + 1 + self.rng.randrange(5)) % self.toy_lm.VOCAB
            out.append(draft)
        return out

    def finish(self, request_id, token_ids, num_prompt_tokens):
        self.finished.append(request_id)


def spec_engine(toy, proposer=None, k=4, **overrides):
    cfg = SpeculativeConfig(proposer="ngram", num_speculative_tokens=k, dynamic_k=False)
    engine = toy.engine(speculative=cfg, **overrides)
    if proposer is not None:
        engine.speculator = Speculator(cfg, proposer)
        engine.runner.speculator = engine.speculator
    return engine


def drafted(engine, name: str = "oracle") -> ProposerStats:
    """The proposer's counters, asserting that it drafted: an equality with speculation
    off proves nothing about verification if no draft was ever checked."""
    stats = engine.stats().speculative[name]
    assert stats.proposals > 0 and stats.draft_tokens > 0, f"{name} never drafted: {stats}"
    return stats


PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8], [1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.mark.parametrize("wrong_at", [(), (0,), (2,), (1, 3)])
def test_greedy_is_token_exact_whatever_the_drafts(toy, wrong_at):
    engine = spec_engine(toy, OracleProposer(toy.LM, wrong_at=wrong_at))
    out = engine.generate(PROMPTS, GREEDY)
    assert out == [toy.greedy(p, 20) for p in PROMPTS]
    stats = drafted(engine)
    if not wrong_at:  # perfect drafts: k + 1 tokens a step (less where max_tokens caps k)
        assert stats.acceptance_rate == 1.0
        assert 4.5 < stats.mean_accepted_length <= 5.0
    elif 0 in wrong_at:
        assert stats.accepted_tokens == 0
    # nothing leaks: all blocks are back
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_total_blocks


def test_model_free_proposers_are_exact_on_the_toy(toy):
    for name in ("ngram", "suffix"):
        cfg = SpeculativeConfig(proposer=name, num_speculative_tokens=3)
        engine = toy.engine(speculative=cfg)
        prompt = [5, 6, 7, 8] * 6  # repetitive, so both find matches
        assert engine.generate([prompt], GREEDY) == [toy.greedy(prompt, 20)]
        drafted(engine, name)


def test_rejected_drafts_are_not_computed_twice_and_steps_shrink(toy):
    lm = toy.LM()
    engine = spec_engine(toy, OracleProposer(toy.LM), model=lm)
    engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=21, ignore_eos=True))
    # a 1-step prefill, then 4 verification steps of 5 tokens (k=4 + 1) each
    assert engine.stats().steps_total == 5


def test_draft_longer_than_max_tokens_is_capped(toy):
    proposer = OracleProposer(toy.LM, length=50)
    engine = spec_engine(toy, proposer, k=8)
    for max_tokens in (1, 2, 3, 7):
        before = engine.stats().speculative.get("oracle", ProposerStats())
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        out = engine.generate([PROMPTS[1]], sp)
        assert out == [toy.greedy(PROMPTS[1], max_tokens)]
        after = engine.stats().speculative.get("oracle", ProposerStats())
        # the prefill samples the first token, one verification step the last: the
        # drafts in between are capped to the max_tokens - 2 tokens still wanted
        assert after.draft_tokens - before.draft_tokens == max(0, max_tokens - 2)


def test_draft_through_a_stop_token_stops_there(toy):
    ref = toy.greedy(PROMPTS[2], 20)
    stop_at = 6
    assert ref[stop_at] not in ref[:stop_at]
    engine = spec_engine(toy, OracleProposer(toy.LM, length=8), k=8)
    engine.add_request(
        "r",
        PROMPTS[2],
        SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=(ref[stop_at],)),
    )
    tokens, last = [], None
    while engine.has_unfinished_requests():
        for o in engine.step():
            tokens += o.new_token_ids
            last = o
    assert tokens == ref[:stop_at]
    assert drafted(engine).accepted_tokens > 0
    assert last.finished and last.finish_reason is FinishReason.STOP
    assert last.matched_stop == ref[stop_at]
    engine.step()  # the proposer hears of the finished request on the next step
    assert engine.speculator.proposer.finished == ["r"]


def test_opt_out_and_processors_never_draft(toy):
    engine = spec_engine(toy, OracleProposer(toy.LM))
    engine.add_request("off", PROMPTS[0], GREEDY, speculative=False)
    engine.add_request(
        "pen",
        PROMPTS[1],
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, presence_penalty=0.5),
    )
    engine.add_request("on", PROMPTS[2], GREEDY)
    steps = {"off": 0, "pen": 0, "on": 0}
    while engine.has_unfinished_requests():
        for o in engine.step():
            steps[o.request_id] += 1
    assert steps["off"] == 20 and steps["pen"] == 20
    assert steps["on"] == 5  # the prefill's token, then 19 in steps of 5, 5, 5, 4
    assert engine.stats().speculative["oracle"].proposals == 4


def test_dynamic_k_stops_drafting_when_nothing_is_accepted(toy):
    cfg = SpeculativeConfig(proposer="ngram", num_speculative_tokens=4, dynamic_k=True)
    engine = toy.engine(speculative=cfg)
    engine.speculator = Speculator(cfg, OracleProposer(toy.LM, wrong_at=(0,)))
    engine.runner.speculator = engine.speculator
    sp = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    assert engine.generate([PROMPTS[0]], sp) == [toy.greedy(PROMPTS[0], 60)]
    stats = engine.stats().speculative["oracle"]
    assert stats.accepted_tokens == 0
    # a few full-k proposals, then backed off to rare one-token probes
    assert stats.proposals < 20
    assert stats.draft_tokens < 4 * stats.proposals


def test_sampling_with_speculation_runs_and_is_seed_reproducible(toy):
    sp = SamplingParams(temperature=1.0, seed=7, max_tokens=24, ignore_eos=True)
    engines = [spec_engine(toy, OracleProposer(toy.LM)) for _ in range(2)]
    a, b = (e.generate(PROMPTS, sp) for e in engines)
    assert a == b
    assert drafted(engines[0]) == drafted(engines[1])
    assert all(len(x) == 24 for x in a)


def test_preemption_with_drafts_keeps_greedy_output(toy):
    # a pool too small for all three: requests get preempted with drafts planned
    engine = spec_engine(toy, OracleProposer(toy.LM, wrong_at=(2,)), num_kv_blocks=14)
    sp = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    assert engine.generate(PROMPTS, sp) == [toy.greedy(p, 30) for p in PROMPTS]
    assert engine.scheduler.num_preemptions_total > 0
    stats = drafted(engine)
    assert 0 < stats.accepted_tokens < stats.draft_tokens  # drafts wrong from offset 2


def test_sampled_tokens_keep_the_target_distribution_end_to_end(toy):
    """Temperature 1 on the toy model: at every position the model's top token has
    probability e^4 / (e^4 + 96) = 0.3626 (logits are 4 * one-hot over 97 tokens). The
    oracle drafts exactly those top tokens, so a verifier that favoured drafts would push
    the top-token rate towards 1. Tolerance: 4.5 standard deviations of a frequency over
    N = 1500 requests (0.058); fixed engine seed."""
    import math

    n, length = 1500, 4
    p_top = math.exp(4) / (math.exp(4) + 96)
    tol = 4.5 * math.sqrt(p_top * (1 - p_top) / n)
    engine = spec_engine(toy, OracleProposer(toy.LM), k=3, num_kv_blocks=1024, max_num_seqs=256)
    sp = SamplingParams(temperature=1.0, max_tokens=length, ignore_eos=True)
    prompt = PROMPTS[0]
    outs = engine.generate([prompt] * n, sp)
    assert engine.stats().speculative["oracle"].accepted_tokens > n // 2  # drafts were used
    for pos in range(length):
        top = sum(o[pos] == toy.LM.next_token(prompt + o[:pos]) for o in outs) / n
        assert abs(top - p_top) < tol, (pos, top)


@pytest.mark.parametrize("wrong_at", [(0,), (1,), ()])
def test_rejected_drafts_give_their_blocks_back(toy, wrong_at):
    """Invariant between steps, for every running sequence: its table holds exactly
    ceil(num_computed_tokens / block_size) blocks (the next step reserves what it needs,
    drafts included, and the commit trims what the target rejected)."""
    engine = spec_engine(toy, OracleProposer(toy.LM, length=8, wrong_at=wrong_at), k=8)
    bm = engine.block_manager
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, GREEDY)
    outs: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    verified_steps = 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] += o.new_token_ids
        running = engine.scheduler.running
        verified_steps += any(s.spec_tracker is not None for s in running)
        for seq in running:
            assert len(seq.block_table) == bm.blocks_for_tokens(seq.num_computed_tokens)
        held = sum(len(s.block_table) for s in running)
        assert bm.num_used_blocks == held
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_total_blocks
    assert verified_steps > 0
    assert list(outs.values()) == [toy.greedy(p, 20) for p in PROMPTS]
    stats = drafted(engine)
    if wrong_at:
        assert stats.draft_tokens > stats.accepted_tokens
    assert bm.num_free_blocks == bm.num_total_blocks
