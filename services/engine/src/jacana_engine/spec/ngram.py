"""N-gram (prompt lookup) proposer: copy what followed the last occurrence of the tail.

For n from ``ngram_max`` down to ``ngram_min`` it looks for an earlier occurrence of the
last n tokens and drafts the tokens that followed the most recent such occurrence (recent
text predicts the continuation better than the first occurrence does in generated output).

:func:`ngram_draft` states the rule as one search over the whole history (numpy). The
proposer gets the same answers from an index per request (:class:`NgramIndex`): each
n-gram's most recent start, extended by the tokens added since the last step, so a step
costs O(new tokens + ngram_max) per request instead of a scan of the history. That is
what keeps it cheap beside a GPU decode step of a few milliseconds for 32 requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jacana_engine.spec.proposer import DraftRequest, Proposer


def ngram_draft(tokens: np.ndarray, n_min: int, n_max: int, max_draft: int) -> list[int]:
    """The draft for one history.

    tokens: [L] int64, the history; the match must end before its last token.
    Returns up to ``max_draft`` tokens (possibly fewer: the history ends), or [].
    """
    length = tokens.shape[0]
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        pattern = tokens[length - n :]  # [n]
        # windows[i] = tokens[i : i + n] for every start whose window ends before the tail
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)  # [L-n, n]
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size == 0:
            continue
        start = int(hits[-1]) + n  # the most recent occurrence's continuation
        return tokens[start : start + max_draft].tolist()
    return []


class NgramIndex:
    """One history's n-grams: for each n in [n_min, n_max], every n-gram that ends before
    the history's last token -> its most recent start. Histories only grow (prompt +
    accepted output); one that does not extend the indexed one is indexed anew."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.starts: dict[tuple[int, ...], int] = {}  # n-gram (any n) -> most recent start

    def draft(self, history: Sequence[int], max_draft: int) -> list[int]:
        """``ngram_draft`` of ``history`` (same answer), updating the index first."""
        self._extend(history)
        tokens, length = self.tokens, len(self.tokens)
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            start = self.starts.get(tuple(tokens[length - n :]))
            if start is not None:
                return tokens[start + n : start + n + max_draft]
        return []

    def _extend(self, history: Sequence[int]) -> None:
        known = len(self.tokens)
        if known > len(history) or (known and history[known - 1] != self.tokens[-1]):
            self.tokens, self.starts, known = [], {}, 0  # not an extension: start over
        old_limit = max(0, known - 1)  # windows ending before the old last token: indexed
        self.tokens.extend(history[known:])
        tokens, limit = self.tokens, len(self.tokens) - 1  # windows must end before this
        for n in range(self.n_min, self.n_max + 1):
            # windows tokens[i : i + n] with i + n <= limit, new since the last call
            for i in range(max(0, old_limit - n + 1), limit - n + 1):
                self.starts[tuple(tokens[i : i + n])] = i


class NgramProposer(Proposer):
    """Prompt lookup over the request's own prompt + output (an index per request)."""

    name = "ngram"

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self._indexes: dict[str, NgramIndex] = {}

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        drafts = []
        for r in requests:
            index = self._indexes.get(r.request_id)
            if index is None:
                index = self._indexes[r.request_id] = NgramIndex(self.ngram_min, self.ngram_max)
            drafts.append(index.draft(r.token_ids, r.max_draft))
        return drafts

    def finish(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        self._indexes.pop(request_id, None)
