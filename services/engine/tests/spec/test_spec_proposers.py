"""Proposers (n-gram, suffix), the registry and dynamic k: pure host-side behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from jacana_engine.spec.acceptance import AcceptanceTracker, ProposerStats
from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.ngram import NgramProposer, ngram_draft
from jacana_engine.spec.proposer import DraftRequest
from jacana_engine.spec.registry import create_proposer, proposer_names
from jacana_engine.spec.suffix import SuffixProposer, _SuffixAutomaton


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


def test_suffix_automaton_counts_substrings_up_to_max_depth_and_uncounts_them():
    strings = [[1, 2, 1, 2], [2, 1, 2, 2, 1], [1, 1, 1, 1, 1, 2]]
    automaton = _SuffixAutomaton(max_depth=3)
    for string in strings:
        for tok in string:
            automaton.append(tok)
        automaton.close()

    def expected(live):  # occurrences, and those at a string's end, of every substring
        counts = {}
        for string in live:
            for end in range(1, len(string) + 1):
                for start in range(max(0, end - 3), end):
                    occ, ends = counts.get(tuple(string[start:end]), (0, 0))
                    counts[tuple(string[start:end])] = (occ + 1, ends + (end == len(string)))
        return counts

    def counted():  # every substring the automaton holds, up to max_depth, with a count
        found, frontier = {}, [((), 0)]
        while frontier:
            sub, state = frontier.pop()
            if sub and automaton.count[state]:
                found[sub] = (automaton.count[state], automaton.ends[state])
            if len(sub) < 3:
                frontier += [((*sub, tok), nxt) for tok, nxt in automaton.next[state].items()]
        return found

    assert counted() == expected(strings)
    assert counted()[(1, 2)] == (4, 2)  # ends two of the strings
    automaton.remove(strings[0])
    assert counted() == expected(strings[1:])
    automaton.remove(strings[2])
    automaton.remove(strings[1])
    assert counted() == {}


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
    assert list(p._recent) == [[30, 31, 32]]  # a's output is not counted any more


def test_suffix_indexes_finished_outputs_at_the_next_proposal_with_the_same_result():
    rng = np.random.default_rng(3)
    lazy = SuffixProposer(max_depth=6, min_prob=0.0, max_cached_requests=3)
    eager = SuffixProposer(max_depth=6, min_prob=0.0, max_cached_requests=3)
    for i in range(8):  # more finished requests than the shared cache keeps
        history = [int(t) for t in rng.integers(0, 5, size=12)]
        lazy.finish(f"r{i}", history, num_prompt_tokens=2)
        eager.finish(f"r{i}", history, num_prompt_tokens=2)
        eager.propose([])  # indexes now
    assert not lazy._recent and len(lazy._unindexed) == 3  # nothing indexed yet
    probes = [
        _req([int(t) for t in rng.integers(0, 5, size=6)], k=4, rid=f"p{j}") for j in range(20)
    ]
    assert lazy.propose(probes) == eager.propose(probes)
    assert len(lazy._recent) == len(eager._recent) == 3


class _TrieNode:
    __slots__ = ("children", "count")

    def __init__(self):
        self.children, self.count = {}, 0


class _TrieSuffixProposer:
    """The reference: suffix decoding over bounded-depth suffix tries whose nodes count
    occurrences (the first implementation, kept to check the automata against)."""

    def __init__(self, max_depth, min_prob, max_cached_requests=256):
        self.depth, self.min_prob, self.cache = max_depth, min_prob, max_cached_requests
        self.shared, self.recent = _TrieNode(), []  # outputs in the shared trie, oldest first
        self.live = {}  # request id -> [own trie root, tokens indexed, active nodes]

    def _add(self, tokens, sign):
        for start in range(len(tokens)):
            node = self.shared
            for tok in tokens[start : start + self.depth]:
                child = node.children.get(tok)
                if child is None:
                    child = node.children[tok] = _TrieNode()
                child.count += sign
                if child.count == 0:
                    del node.children[tok]
                    break
                node = child

    def finish(self, request_id, token_ids, num_prompt_tokens):
        self.live.pop(request_id, None)
        output = list(token_ids[num_prompt_tokens:])
        if self.cache and output:
            self._add(output, 1)
            self.recent.append(output)
            if len(self.recent) > self.cache:
                self._add(self.recent.pop(0), -1)

    def propose(self, requests):
        return [self._propose_one(r) for r in requests]

    def _propose_one(self, r):
        own = self.live.setdefault(r.request_id, [_TrieNode(), 0, []])
        for tok in r.token_ids[own[1] :]:  # every suffix's node gets tok as a child
            nxt = []
            for node in [own[0], *own[2]]:
                child = node.children.setdefault(tok, _TrieNode())
                child.count += 1
                nxt.append(child)
            own[2] = nxt[: self.depth - 1]
        own[1] = len(r.token_ids)
        m_own = max((j + 1 for j, node in enumerate(own[2]) if node.children), default=0)
        tail, m_shared, node_shared = r.token_ids[-(self.depth - 1) :], 0, None
        for m in range(len(tail), 0, -1):
            node = self.shared
            for tok in tail[len(tail) - m :]:
                node = node.children.get(tok) if node else None
            if node is not None and node.children:
                m_shared, node_shared = m, node
                break
        node = own[2][m_own - 1] if m_own and m_own >= m_shared else node_shared
        draft, prob = [], 1.0
        while node is not None and len(draft) < r.max_draft and node.children:
            total = sum(c.count for c in node.children.values())
            tok, node = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))
            prob *= node.count / total
            if prob < self.min_prob:
                break
            draft.append(tok)
        return draft


@pytest.mark.parametrize(
    "max_depth,min_prob,max_cached,vocab",
    [
        (2, 0.0, 0, 3),  # max_cached_requests=0: nothing shared
        (3, 0.0, 1, 2),
        (4, 0.1, 2, 5),
        (5, 0.5, 4, 4),
        (6, 0.3, 3, 6),
        (8, 0.0, 5, 8),
        (32, 0.1, 256, 5),  # the defaults: nothing ages out
    ],
)
def test_suffix_drafts_what_the_suffix_tries_draft(max_depth, min_prob, max_cached, vocab):
    """Random interleavings of growing histories, finishes and outputs aging out: the
    automata draft exactly what the tries do, at every step."""
    rng = np.random.default_rng([max_depth, max_cached, vocab])
    proposer = SuffixProposer(max_depth, min_prob, max_cached)
    reference = _TrieSuffixProposer(max_depth, min_prob, max_cached)
    live, next_id = {}, 0
    for _ in range(400):
        while len(live) < 4:  # new requests, some with a repetitive prompt
            prompt = rng.integers(0, vocab, size=int(rng.integers(1, 25))).tolist()
            if rng.random() < 0.3:
                prompt = (prompt[: int(rng.integers(1, 4))] * 20)[: len(prompt) + 10]
            live[f"r{next_id}"], next_id = prompt, next_id + 1
        if rng.random() < 0.1:  # finish one: its output may go to the shared cache
            rid = list(live)[int(rng.integers(len(live)))]
            history = live.pop(rid)
            num_prompt = int(rng.integers(0, len(history) + 1))
            proposer.finish(rid, history, num_prompt)
            reference.finish(rid, history, num_prompt)
            continue
        ids = [rid for rid in live if rng.random() < 0.7]
        reqs = [_req(live[rid], k=int(rng.integers(1, 2 * max_depth)), rid=rid) for rid in ids]
        drafts = proposer.propose(reqs)
        assert drafts == reference.propose(reqs), [(r.request_id, r.token_ids) for r in reqs]
        for rid, draft in zip(ids, drafts, strict=True):  # accept some, then one token more
            take = int(rng.integers(0, len(draft) + 1))
            live[rid] += [
                *draft[:take],
                *rng.integers(0, vocab, size=int(rng.integers(1, 3))).tolist(),
            ]
    assert len(proposer._recent) == len(reference.recent) <= max_cached


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
