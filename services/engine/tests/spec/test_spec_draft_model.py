"""Draft-model proposer on the toy model: its own paged KV cache, rollback by truncation
when drafts are rejected, blocks returned on finish."""

from __future__ import annotations

import pytest

from jacana_engine.sample.params import SamplingParams
from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.draft_model import DraftModelProposer
from jacana_engine.spec.proposer import DraftRequest
from jacana_engine.spec.speculator import Speculator

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_drafts_are_the_draft_models_greedy_continuation(toy):
    p = DraftModelProposer(toy.LM(), num_blocks=16, block_size=4)
    prompt = [3, 1, 4, 1, 5]
    assert p.propose([DraftRequest("a", prompt, 5, 4)]) == [toy.greedy(prompt, 4)]
    # history diverged from the drafts after one token: the cache rolls back and agrees
    history = [*prompt, toy.greedy(prompt, 1)[0], 7]
    assert p.propose([DraftRequest("a", history, 5, 3)]) == [toy.greedy(history, 3)]
    # batched with a new request of another length
    other = [9, 9, 9, 9, 9, 9, 9, 2, 2]
    out = p.propose([DraftRequest("b", other, 9, 2), DraftRequest("a", history, 5, 1)])
    assert out == [toy.greedy(other, 2), toy.greedy(history, 1)]
    used = 16 - len(p._free)
    p.finish("a", history, 5)
    p.finish("b", other, 9)
    assert used > 0 and len(p._free) == 16


def test_a_full_draft_cache_drafts_nothing(toy):
    p = DraftModelProposer(toy.LM(), num_blocks=2, block_size=4)
    assert p.propose([DraftRequest("a", list(range(1, 12)), 11, 2)]) == [[]]
    assert p.propose([DraftRequest("b", [1, 2, 3], 3, 2)]) == [toy.greedy([1, 2, 3], 2)]


def test_engine_with_a_self_drafting_toy_is_exact_and_accepts_everything(toy):
    cfg = SpeculativeConfig(proposer="ngram", num_speculative_tokens=3, dynamic_k=False)
    engine = toy.engine(speculative=cfg)
    engine.speculator = Speculator(cfg, DraftModelProposer(toy.LM(), num_blocks=32, block_size=4))
    engine.runner.speculator = engine.speculator
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]]
    sp = SamplingParams(temperature=0.0, max_tokens=17, ignore_eos=True)
    assert engine.generate(prompts, sp) == [toy.greedy(p, 17) for p in prompts]
    s = engine.stats().speculative["draft_model"]
    assert s.proposals > 0 and s.draft_tokens > 0
    assert s.acceptance_rate == 1.0 and s.mean_accepted_length == 4.0


class RecordingProposer(DraftModelProposer):
    """Keeps the prompt lengths of each ``propose`` call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[list[int]] = []

    def propose(self, requests):
        self.calls.append([len(r.token_ids) for r in requests])
        return super().propose(requests)


def test_warm_up_drafts_every_prompt_shape_and_leaves_the_cache_as_it_was(toy):
    warmed = RecordingProposer(toy.LM(), num_blocks=32, block_size=4, max_batch=4)
    assert warmed.warm_up() > 0
    # a short prompt, three, two, then four (the batch bound) with one long (what the
    # cache holds)
    calls = warmed.calls
    assert calls[:3] == [[8], [8, 8, 8], [8, 8]] and len(calls[3]) == 4 and max(calls[3]) > 8
    assert len(warmed._free) == 32 and warmed._states == {}
    fresh = DraftModelProposer(toy.LM(), num_blocks=32, block_size=4, max_batch=4)
    history = [5, 3, 5, 8, 9, 7]
    request = [DraftRequest("a", history, 6, 3)]
    assert warmed.propose(request) == fresh.propose(request) == [toy.greedy(history, 3)]


def test_the_engine_warm_up_warms_its_proposer_and_leaves_the_speculator_alone(toy):
    cfg = SpeculativeConfig(proposer="ngram", num_speculative_tokens=2, dynamic_k=False)
    engine = toy.engine(speculative=cfg, warm_up=False)
    proposer = RecordingProposer(toy.LM(), num_blocks=64, block_size=4)
    engine.speculator = Speculator(cfg, proposer)
    engine.runner.speculator = engine.speculator
    before = engine.speculator.stats()
    engine.warm_up()
    assert len(proposer.calls) == 4  # its own warm-up; the engine's requests drafted nothing
    assert engine.speculator.stats() == before
    assert len(proposer._free) == 64 and proposer._states == {}
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6]]
    sp = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    assert engine.generate(prompts, sp) == [toy.greedy(prompts[0], 9)]
    s = engine.speculator.stats()["draft_model"]
    assert s.proposals > 0 and s.accepted_tokens == s.draft_tokens > 0  # self-drafting
