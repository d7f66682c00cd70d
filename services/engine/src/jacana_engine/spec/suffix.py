"""Suffix decoding proposer: frequency-ranked continuations of the longest recurring tail.

Idea (Suffix Decoding, Oliaro et al.; ArcticInference): count every substring of length
<= ``max_depth`` of the token histories seen (a bounded-depth suffix trie whose nodes
count occurrences). The longest tail of the history (< ``max_depth`` tokens) that has
been seen followed by some token is the context; walking down its most frequent
continuations (ties: the smaller token id) drafts, stopping when the estimated
probability of the whole draft (product of count(string + token) / sum of the counts
of the string's continuations) drops below ``min_prob``.

The counts live in suffix automata instead of tries: a trie creates or visits
``max_depth`` nodes per token, while an automaton adds at most two states per token in
amortized constant time, and a state (the class of substrings that end at the same
positions) holds one count for all its substrings, so a token updates only the few
states of its suffixes whose counts differ. The drafts are exactly the trie's.

Two sources per proposer (host-side, owned by the proposer):
- one automaton per live request over its prompt + output, extended by the tokens
  added since the last step; its context is the longest tail that occurred before;
- the outputs of the last ``max_cached_requests`` finished requests (counted when a
  request finishes, uncounted when it ages out), in two automata by age: states cannot
  be taken out, so the older one is dropped whole once its outputs have all aged out.
  Insertion waits for the next ``propose``: while drafting is paused (``spec/gate.py``)
  finishing requests cost nothing, and the counts a proposal sees are the same either
  way.
The longer context wins; the request's own history wins ties.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence

from jacana_engine.spec.proposer import DraftRequest, Proposer

_stamps = itertools.count(1)


class _SuffixAutomaton:
    """Suffix automaton of token strings, with the counts of a depth-limited suffix trie.

    A state (an int; 0 is the root, the empty string) stands for the substrings that end
    at the same set of positions: ``length[v]`` is the longest of them, ``link[v]`` the
    state of the longest suffix of those that ends at more positions, and
    ``next[v][tok]`` the state of ``s + [tok]`` for every substring ``s`` of ``v``.
    ``count[v]``: the occurrences of ``v``'s substrings in the counted strings;
    ``ends[v]``: those at the end of a closed string (so not followed by a token).
    Both are exact for every state holding a substring of length <= ``max_depth`` (the
    nodes of the trie: ``length[link[v]] < max_depth``) and left stale for the others,
    which are never read: that bounds the counting per token by ``max_depth`` states,
    and in practice by the few whose counts differ.

    One string is extended at a time (``append``, then ``close`` to start the next);
    ``remove`` uncounts a closed string, whose states stay (an automaton cannot give
    them back). ``stamp`` changes with every string closed: a ``match`` against the
    closed strings can be carried on while it is the same (``remove`` keeps it valid).
    """

    __slots__ = (
        "_last",
        "_tail",
        "_tip",
        "count",
        "ends",
        "length",
        "link",
        "max_depth",
        "next",
        "stamp",
    )

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.next: list[dict[int, int]] = [{}]
        self.link = [-1]
        self.length = [0]
        self.count = [0]
        self.ends = [0]
        self.stamp = next(_stamps)
        self._start()

    def _start(self) -> None:
        self._last = 0  # state of the whole string being extended
        self._tail = 0  # state of its suffix of length min(len, max_depth - 1)
        self._tip = 0  # state of its suffix of length min(len, max_depth)

    def append(self, tok: int) -> None:
        """Extend the current string by ``tok`` and count the substrings it ends."""
        nxt, link, length = self.next, self.link, self.length
        last = self._last
        q = nxt[last].get(tok)
        if q is not None:
            # Another string already went on with tok here (never within one string): the
            # new end joins q's class, or the part of it no longer than the string + tok.
            cur = q if length[q] == length[last] + 1 else self._split(last, q, tok)
        else:
            cur = self._new(length[last] + 1, {}, 0, 0, 0)
            p = last
            while p >= 0 and tok not in nxt[p]:
                nxt[p][tok] = cur
                p = link[p]
            if p >= 0:
                q = nxt[p][tok]
                link[cur] = q if length[q] == length[p] + 1 else self._split(p, q, tok)
        self._last = cur
        self._tail, self._tip = self._advance(self._tail, tok)
        self._add(self.count, self._tip, 1)

    def close(self) -> None:
        """End the current string: its last tokens are not followed by anything."""
        self._add(self.ends, self._tip, 1)
        self.stamp = next(_stamps)
        self._start()

    def remove(self, tokens: Sequence[int]) -> None:
        """Uncount a closed string (it must have been appended and closed)."""
        tail = tip = 0
        for tok in tokens:
            tail, tip = self._advance(tail, tok)
            self._add(self.count, tip, -1)
        self._add(self.ends, tip, -1)

    def own_context(self) -> tuple[int, int]:
        """(state, length) of the current string's longest suffix, shorter than
        ``max_depth``, that also ended earlier (so was followed by a token); (0, 0): none.
        """
        if self._last == 0:
            return 0, 0
        earlier = self.link[self._last]
        if self.length[earlier] >= self.max_depth - 1:
            return self._tail, self.max_depth - 1
        return earlier, self.length[earlier]

    def match(self, tokens: Sequence[int], state: int = 0, n: int = 0) -> tuple[int, int]:
        """Carry a text's match on over ``tokens``, appended to the text.

        The match of a text is (state, n): its longest suffix of at most
        ``max_depth - 1`` tokens that occurs here (counted or not) is n tokens long and
        in ``state``. (0, 0) is the empty text's; from there, the text's last
        ``max_depth - 1`` tokens give the text's match.
        """
        nxt, link, length = self.next, self.link, self.length
        cap = self.max_depth - 1
        for tok in tokens:
            while state and tok not in nxt[state]:
                state = link[state]
                n = length[state]
            following = nxt[state].get(tok)
            if following is None:
                n = 0  # at the root
                continue
            state, n = following, n + 1
            if n > cap:  # keep the last cap tokens
                n = cap
                if length[link[state]] == cap:
                    state = link[state]
        return state, n

    def context(self, state: int, n: int) -> tuple[int, int]:
        """(state, n) of the longest suffix of a ``match`` that a counted string goes on
        from (occurs followed by a token); (0, 0): none."""
        count, ends, link = self.count, self.ends, self.link
        while state and count[state] == ends[state]:
            state = link[state]
            n = self.length[state]
        return state, n

    def state_of_suffix(self, state: int, n: int) -> int:
        """The state of the length-``n`` suffix of ``state``'s substrings."""
        link, length = self.link, self.length
        while length[link[state]] >= n:
            state = link[state]
        return state

    def _advance(self, tail: int, tok: int) -> tuple[int, int]:
        """(tail, tip) of a string + ``tok`` from the tail state of the string."""
        tip = self.next[tail][tok]
        shorter = self.link[tip]
        # tip holds the suffixes of lengths length[shorter] + 1 .. length[tip]: the one of
        # max_depth - 1 too, unless that range starts at max_depth; then it is shorter's.
        return (shorter if self.length[shorter] == self.max_depth - 1 else tip), tip

    def _add(self, counts: list[int], state: int, delta: int) -> None:
        """Add ``delta`` to ``counts`` of ``state`` and of all its shorter suffixes."""
        link = self.link
        while state > 0:
            counts[state] += delta
            state = link[state]

    def _split(self, p: int, q: int, tok: int) -> int:
        """Move q's substrings of length <= ``length[p] + 1`` (suffixes of the string +
        tok: they now also end at its end) to a new state with q's counts so far and q's
        transitions; the tok transitions from p and its suffixes that led to q lead there."""
        link, nxt = self.link, self.next
        clone = self._new(self.length[p] + 1, dict(nxt[q]), link[q], self.count[q], self.ends[q])
        link[q] = clone
        while p >= 0 and nxt[p].get(tok) == q:
            nxt[p][tok] = clone
            p = link[p]
        return clone

    def _new(self, length: int, nxt: dict[int, int], link: int, count: int, ends: int) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.count.append(count)
        self.ends.append(ends)
        return len(self.length) - 1


def _draft(
    sources: list[tuple[_SuffixAutomaton, int]],
    depth: int,
    max_draft: int,
    max_depth: int,
    min_prob: float,
) -> list[int]:
    """Follow the most frequent continuation while the draft's estimated probability
    holds. ``sources``: (automaton, state) of the context (``depth`` tokens) where it
    occurs; their counts add up. Strings longer than ``max_depth`` are not counted."""
    if len(sources) == 1:
        return _draft_one(*sources[0], min(max_draft, max_depth - depth), min_prob)
    draft: list[int] = []
    prob = 1.0
    for _ in range(min(max_draft, max_depth - depth)):
        counts: dict[int, int] = {}
        for automaton, state in sources:
            count = automaton.count
            for tok, child in automaton.next[state].items():
                if count[child]:
                    counts[tok] = counts.get(tok, 0) + count[child]
        if not counts:
            break
        best, share = _most_frequent(counts)
        prob *= share
        if prob < min_prob:
            break
        draft.append(best)
        sources = [(a, a.next[state][best]) for a, state in sources if best in a.next[state]]
    return draft


def _most_frequent(counts: dict[int, int]) -> tuple[int, float]:
    """The most frequent continuation (ties: the smaller token id) and its share."""
    best = max(counts, key=lambda tok: (counts[tok], -tok))
    return best, counts[best] / sum(counts.values())


def _draft_one(automaton: _SuffixAutomaton, state: int, steps: int, min_prob: float) -> list[int]:
    """``_draft`` from a single source: nothing to merge, and an only continuation (the
    usual case deep in a context) needs no ranking: its probability is 1."""
    nxt, count = automaton.next, automaton.count
    draft: list[int] = []
    prob = 1.0
    for _ in range(steps):
        children = nxt[state]
        if len(children) == 1:
            ((best, state),) = children.items()
            if not count[state]:  # uncounted (a shared string that aged out)
                break
        else:
            counts = {tok: count[child] for tok, child in children.items() if count[child]}
            if not counts:
                break
            best, share = _most_frequent(counts)
            prob *= share
            if prob < min_prob:
                break
            state = children[best]
        draft.append(best)
    return draft


class _Request:
    """A live request: its own automaton and its matches against the shared ones."""

    __slots__ = ("matches", "num_indexed", "own")

    def __init__(self, max_depth: int) -> None:
        self.own = _SuffixAutomaton(max_depth)
        self.num_indexed = 0
        # shared automaton's stamp -> (history length, state, n) of its match
        self.matches: dict[int, tuple[int, int, int]] = {}


class SuffixProposer(Proposer):
    """Suffix decoding over the request's own history and recent requests' outputs."""

    name = "suffix"

    def __init__(
        self, max_depth: int = 32, min_prob: float = 0.1, max_cached_requests: int = 256
    ) -> None:
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError("min_prob must be in [0, 1]")
        if max_depth < 2:
            raise ValueError("max_depth must be >= 2")
        self.max_depth = max_depth
        self.min_prob = min_prob
        self.max_cached_requests = max_cached_requests
        # The cached outputs are counted in two automata: new ones go to young; old holds
        # the ones from before young began, which age out first. Once young has taken
        # max_cached_requests outputs, old has none left and is dropped whole, so neither
        # grows past a cache's worth of outputs although states are never taken out.
        self._young = _SuffixAutomaton(max_depth)
        self._young_outputs = 0
        self._old: _SuffixAutomaton | None = None
        self._recent: deque[list[int]] = deque()  # outputs counted, oldest first
        # finished outputs not inserted yet; older ones would age out before being read
        self._unindexed: deque[list[int]] = deque(maxlen=max(1, max_cached_requests))
        self._live: dict[str, _Request] = {}

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        self._index_finished()
        shared = [] if self._old is None else [self._old]
        if self._young_outputs:  # empty at first and after each turnover
            shared.append(self._young)
        return [self._propose_one(r, shared) for r in requests]

    def _index_finished(self) -> None:
        while self._unindexed:
            output = self._unindexed.popleft()
            for tok in output:
                self._young.append(tok)
            self._young.close()
            self._young_outputs += 1
            self._recent.append(output)
            if len(self._recent) > self.max_cached_requests:
                aged = self._recent.popleft()
                # counted in old (young has the newest ones); dropped whole below if last
                if self._old is not None and self._young_outputs < self.max_cached_requests:
                    self._old.remove(aged)
            if self._young_outputs == self.max_cached_requests:
                self._old = self._young  # everything that was in old has aged out
                self._young, self._young_outputs = _SuffixAutomaton(self.max_depth), 0

    def _propose_one(self, r: DraftRequest, shared: list[_SuffixAutomaton]) -> list[int]:
        tokens = r.token_ids
        live = self._live.get(r.request_id)
        if live is None:
            live = self._live[r.request_id] = _Request(self.max_depth)
        own = live.own
        for tok in tokens[live.num_indexed :]:  # histories only grow: these are new
            own.append(tok)
        live.num_indexed = len(tokens)
        own_state, own_len = own.own_context()

        # The history's match in each shared automaton, carried on from the last step
        # while the automaton is unchanged (else matched anew from the last tokens).
        found, matches, shared_len = [], {}, 0
        for automaton in shared:
            known = live.matches.get(automaton.stamp)
            if known is not None and 0 <= len(tokens) - known[0] < self.max_depth:
                state, n = automaton.match(tokens[known[0] :], known[1], known[2])
            else:
                state, n = automaton.match(tokens[-(self.max_depth - 1) :])
            matches[automaton.stamp] = (len(tokens), state, n)
            found.append((automaton, state, n))
            shared_len = max(shared_len, automaton.context(state, n)[1])
        live.matches = matches

        if own_len >= shared_len:
            if own_len == 0:
                return []
            return _draft([(own, own_state)], own_len, r.max_draft, self.max_depth, self.min_prob)
        # the context in every shared automaton that holds it (counted or not: 0 adds 0)
        sources = [(a, a.state_of_suffix(s, shared_len)) for a, s, n in found if n >= shared_len]
        return _draft(sources, shared_len, r.max_draft, self.max_depth, self.min_prob)

    def finish(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        self._live.pop(request_id, None)
        if self.max_cached_requests == 0:
            return
        output = list(token_ids[num_prompt_tokens:])
        if output:
            self._unindexed.append(output)
