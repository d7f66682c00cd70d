"""Proposers (n-gram, suffix), the registry and dynamic k: pure host-side behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from jacana_engine.spec.acceptance import AcceptanceTracker, ProposerStats
from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.ngram import NgramProposer, ngram_draft
from jacana_engine.spec.proposer import DraftRequest
from jacana_engine.spec.registry import create_proposer, proposer_names
from jacana_engine.spec.suffix import SuffixProposer, SuffixTrie


def _req(tokens, k=4, rid="r", n_prompt=None):
    return DraftRequest(rid, list(tokens), len(tokens) if n_prompt is None else n_prompt, k)


# ---- n-gram ------------------------------------------------------------------------------


def test_ngram_copies_what_followed_the_most_recent_match():
    tokens = np.array([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3])
    # "1 2 3" occurred at 0 (-> 9 9) and at 5 (-> 7 8 5): the most recent wins
    assert ngram_draft(tokens, 1, 3, 3) == [7, 8, 5]
    assert ngram_draft(tokens, 1, 3, 1) == [7]


def test_ngram_prefers_longer_matches_and_respects_n_min():
    # last 2 tokens "4 5" occur once (-> 6); last 1 token "5" also occurs later (-> 0)
    tokens = np.array([4, 5, 6, 1, 5, 0, 4, 5])
    assert ngram_draft(tokens, 1, 2, 2) == [6, 1]
    assert ngram_draft(tokens, 1, 1, 2) == [0, 4]
    assert ngram_draft(np.array([1, 2, 3, 4]), 1, 3, 4) == []
    assert ngram_draft(np.array([7, 1, 2, 7]), 2, 3, 4) == []  # only a 1-gram matches


def test_ngram_proposer_batches_and_caps_the_draft():
    p = NgramProposer(1, 3)
    out = p.propose([_req([1, 2, 3, 1, 2], k=2), _req([5, 6, 7], k=3), _req([8, 8], k=5)])
    assert out == [[3, 1], [], [8]]
    with pytest.raises(ValueError):
        NgramProposer(3, 2)


@pytest.mark.parametrize("n_min,n_max", [(1, 4), (2, 3), (1, 1)])
def test_ngram_index_drafts_what_the_full_search_drafts_step_by_step(n_min, n_max):
    rng = np.random.default_rng(n_min * 10 + n_max)
    p = NgramProposer(n_min, n_max)
    for request in range(6):
        history = list(rng.integers(0, 6, size=int(rng.integers(1, 30))))
        rid = f"r{request}"
        while len(history) < 160:
            k = int(rng.integers(1, 9))
            (draft,) = p.propose([_req(history, k=k, rid=rid)])
            assert draft == ngram_draft(np.array(history), n_min, n_max, k), (rid, len(history))
            # the step accepts some of the draft (or none) plus one token of its own
            take = int(rng.integers(0, len(draft) + 1))
            history += [*draft[:take], int(rng.integers(0, 6))]
        p.finish(rid, history, 0)
    assert not p._indexes  # finished requests leave nothing behind
    # a history that does not extend the indexed one (same id) is indexed anew
    for history in ([3, 4, 5, 3, 4], [9, 9, 1, 9]):
        (draft,) = p.propose([_req(history, k=3, rid="x")])
        assert draft == ngram_draft(np.array(history), n_min, n_max, 3)


# ---- suffix ------------------------------------------------------------------------------


def test_suffix_trie_counts_and_removes_substrings():
    trie = SuffixTrie(max_depth=3)
    trie.add([1, 2, 1, 2])
    assert trie.find([1]).count == 2
    assert trie.find([1, 2]).count == 2
    assert trie.find([2, 1, 2]).count == 1
    assert trie.find([1, 2, 1, 2]) is None  # deeper than max_depth
    trie.add([1, 2, 1, 2], sign=-1)
    assert trie.root.children == {}


def test_suffix_drafts_the_most_frequent_continuation_of_its_own_history():
    p = SuffixProposer(max_depth=8, min_prob=0.0)
    history = [7, 1, 2, 3, 7, 1, 2, 4, 7, 1, 2, 3, 8, 7, 1]
    # "8 7 1" is new; after "7 1": "2 3" twice, "2 4" once -> 2 then the majority 3
    assert p.propose([_req(history, k=2)]) == [[2, 3]]


def test_suffix_incremental_indexing_equals_indexing_from_scratch():
    rng = np.random.default_rng(0)
    history = rng.integers(0, 5, size=60).tolist()
    step = SuffixProposer(max_depth=6, min_prob=0.0)
    drafts = [step.propose([_req(history[:n], k=3)])[0] for n in range(10, 61, 5)]
    fresh = [
        SuffixProposer(max_depth=6, min_prob=0.0).propose([_req(history[:n], k=3)])[0]
        for n in range(10, 61, 5)
    ]
    assert drafts == fresh
    assert any(drafts)


def test_suffix_min_prob_stops_uncertain_drafts():
    history = [9, 1, 2, 9, 1, 3, 9, 1, 4, 9, 1]
    # after "9 1": 2, 3, 4 once each -> probability 1/3 for the first draft token
    assert SuffixProposer(8, min_prob=0.5).propose([_req(history)]) == [[]]
    assert SuffixProposer(8, min_prob=0.3).propose([_req(history)])[0][:1] in ([2], [3], [4])


def test_suffix_learns_from_finished_requests_and_forgets_old_ones():
    p = SuffixProposer(max_depth=8, min_prob=0.0, max_cached_requests=1)
    prompt = [100, 101]
    p.finish("a", [*prompt, 7, 8, 9, 10], num_prompt_tokens=2)
    # a new request whose history ends with "7 8" gets "9 10" from a's output
    assert p.propose([_req([50, 7, 8], k=2, rid="b")]) == [[9, 10]]
    p.finish("b", [50, 7, 8], num_prompt_tokens=3)  # no output: nothing learnt
    p.finish("c", [1, 30, 31, 32], num_prompt_tokens=1)  # evicts a's output
    assert p.propose([_req([60, 7, 8], k=2, rid="d")]) == [[]]
    assert p.propose([_req([61, 30, 31], k=2, rid="e")]) == [[32]]
    assert p.shared.find([7]) is None


def test_suffix_indexes_finished_outputs_at_the_next_proposal_with_the_same_result():
    rng = np.random.default_rng(3)
    lazy = SuffixProposer(max_depth=6, min_prob=0.0, max_cached_requests=3)
    eager = SuffixProposer(max_depth=6, min_prob=0.0, max_cached_requests=3)
    for i in range(8):  # more finished requests than the shared trie keeps
        history = [int(t) for t in rng.integers(0, 5, size=12)]
        lazy.finish(f"r{i}", history, num_prompt_tokens=2)
        eager.finish(f"r{i}", history, num_prompt_tokens=2)
        eager.propose([])  # indexes now
    assert lazy.shared.root.children == {}  # nothing indexed while nobody proposed
    probes = [
        _req([int(t) for t in rng.integers(0, 5, size=6)], k=4, rid=f"p{j}") for j in range(20)
    ]
    assert lazy.propose(probes) == eager.propose(probes)
    assert len(lazy._recent) == len(eager._recent) == 3


# ---- registry, dynamic k, counters -------------------------------------------------------


def test_registry_builds_proposers_by_name():
    assert set(proposer_names()) >= {"none", "ngram", "suffix"}
    assert isinstance(create_proposer(SpeculativeConfig(proposer="ngram")), NgramProposer)
    assert isinstance(create_proposer(SpeculativeConfig(proposer="suffix")), SuffixProposer)
    with pytest.raises(ValueError, match="known: ngram"):
        create_proposer(SpeculativeConfig(proposer="nope"))


def test_dynamic_k_backs_off_to_zero_and_probes_again():
    t = AcceptanceTracker(max_k=5, probe_interval=4)
    assert t.next_k() == 5
    for _ in range(10):
        t.record(5, 0)
    ks = [t.next_k() for _ in range(8)]
    assert ks == [0, 0, 0, 1, 0, 0, 0, 1]  # drafting stopped; a probe every 4 steps
    for _ in range(6):
        t.record(1, 1)
    assert t.next_k() == 5  # acceptance came back
    t.rate = 0.5
    assert t.next_k() == 2  # 0.5 ** 2 >= 0.2 > 0.5 ** 3
    assert AcceptanceTracker(max_k=3, dynamic=False, rate=0.0).next_k() == 3


def test_proposer_stats():
    s = ProposerStats().add(4, 4).add(4, 0)
    assert (s.proposals, s.draft_tokens, s.accepted_tokens) == (2, 8, 4)
    assert s.acceptance_rate == 0.5
    assert s.mean_accepted_length == 3.0
    assert ProposerStats().mean_accepted_length == 0.0
