"""Suffix decoding proposer: frequency-ranked continuations from bounded-depth suffix tries.

Idea (Suffix Decoding, Oliaro et al.; ArcticInference): index every substring of length
<= ``max_depth`` of a token history in a trie whose nodes count occurrences. The node
reached by the longest recent tail that has been seen before is a context; walking down
its most frequent children drafts a continuation, stopping when the estimated
probability of the whole draft (product of child count / sibling total) drops below
``min_prob``.

Two tries per proposer (host-side, owned by the proposer):
- one per live request over its prompt + output, extended incrementally: a list of
  *active* nodes (the nodes of the history's suffixes shorter than ``max_depth``) gets
  each new token as a child, O(max_depth) per token;
- one shared over the outputs of the last ``max_cached_requests`` finished requests
  (inserted when a request finishes, removed again when it ages out). Insertion waits
  for the next ``propose``: while drafting is paused (``spec/gate.py``) finishing
  requests cost nothing, and the trie a proposal sees is the same either way.
The longer matching context wins; the request's own trie wins ties.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from jacana_engine.spec.proposer import DraftRequest, Proposer


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0


class SuffixTrie:
    """Counts of every substring (length <= ``max_depth``) of the histories inserted."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 2:
            raise ValueError("max_depth must be >= 2")
        self.max_depth = max_depth
        self.root = _Node()

    def add(self, tokens: Sequence[int], sign: int = 1) -> None:
        """Insert (``sign=1``) or remove (``sign=-1``) one history's substrings."""
        depth = self.max_depth
        for start in range(len(tokens)):
            node = self.root
            for tok in tokens[start : start + depth]:
                child = node.children.get(tok)
                if child is None:
                    if sign < 0:
                        break
                    child = node.children[tok] = _Node()
                child.count += sign
                if child.count <= 0:
                    del node.children[tok]
                    break
                node = child

    def find(self, context: Sequence[int]) -> _Node | None:
        """The node of ``context`` (a path from the root), or None if never seen."""
        node = self.root
        for tok in context:
            node = node.children.get(tok)
            if node is None:
                return None
        return node

    def longest_context(self, tail: Sequence[int], max_len: int) -> tuple[int, _Node | None]:
        """The longest suffix of ``tail`` (<= ``max_len``) seen with a continuation."""
        for m in range(min(max_len, len(tail)), 0, -1):
            node = self.find(tail[len(tail) - m :])
            if node is not None and node.children:
                return m, node
        return 0, None


def walk_draft(node: _Node, max_draft: int, min_prob: float) -> list[int]:
    """Follow the most frequent child while the draft's estimated probability holds."""
    draft: list[int] = []
    prob = 1.0
    while len(draft) < max_draft and node.children:
        total = sum(c.count for c in node.children.values())
        tok, child = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))
        prob *= child.count / total
        if prob < min_prob:
            break
        draft.append(tok)
        node = child
    return draft


@dataclass
class _RequestTrie:
    """A live request's trie and the frontier of its incremental indexing."""

    trie: SuffixTrie
    num_indexed: int = 0
    active: list[_Node] = field(default_factory=list)  # active[j]: node of the last j+1 tokens

    def extend(self, tokens: Sequence[int]) -> None:
        depth = self.trie.max_depth
        for tok in tokens[self.num_indexed :]:
            nxt = []
            for node in [self.trie.root, *self.active]:
                child = node.children.get(tok)
                if child is None:
                    child = node.children[tok] = _Node()
                child.count += 1
                nxt.append(child)
            self.active = nxt[: depth - 1]
        self.num_indexed = len(tokens)

    def context(self) -> tuple[int, _Node | None]:
        """The deepest active node (longest suffix) that has a continuation."""
        for j in range(len(self.active) - 1, -1, -1):
            if self.active[j].children:
                return j + 1, self.active[j]
        return 0, None


class SuffixProposer(Proposer):
    """Suffix decoding over the request's own history and recent requests' outputs."""

    name = "suffix"

    def __init__(
        self, max_depth: int = 32, min_prob: float = 0.1, max_cached_requests: int = 256
    ) -> None:
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError("min_prob must be in [0, 1]")
        self.max_depth = max_depth
        self.min_prob = min_prob
        self.max_cached_requests = max_cached_requests
        self.shared = SuffixTrie(max_depth)
        self._recent: deque[list[int]] = deque()  # outputs in the shared trie, oldest first
        # finished outputs not inserted yet; older ones would age out before being read
        self._unindexed: deque[list[int]] = deque(maxlen=max(1, max_cached_requests))
        self._live: dict[str, _RequestTrie] = {}

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        self._index_finished()
        return [self._propose_one(r) for r in requests]

    def _index_finished(self) -> None:
        while self._unindexed:
            output = self._unindexed.popleft()
            self.shared.add(output)
            self._recent.append(output)
            while len(self._recent) > self.max_cached_requests:
                self.shared.add(self._recent.popleft(), sign=-1)

    def _propose_one(self, r: DraftRequest) -> list[int]:
        own = self._live.get(r.request_id)
        if own is None:
            own = self._live[r.request_id] = _RequestTrie(SuffixTrie(self.max_depth))
        own.extend(r.token_ids)
        m_own, node_own = own.context()
        # Leave room below the context for at least one drafted token.
        m_shared, node_shared = self.shared.longest_context(
            list(r.token_ids[-(self.max_depth - 1) :]), self.max_depth - 1
        )
        node = node_own if m_own >= m_shared else node_shared
        if node is None:
            return []
        return walk_draft(node, r.max_draft, self.min_prob)

    def finish(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        self._live.pop(request_id, None)
        if self.max_cached_requests == 0:
            return
        output = list(token_ids[num_prompt_tokens:])
        if output:
            self._unindexed.append(output)
