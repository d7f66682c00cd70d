"""N-gram (prompt lookup) proposer: copy what followed the last occurrence of the tail.

Stateless across steps: each call searches the request's history with numpy. For n from
``ngram_max`` down to ``ngram_min`` it looks for an earlier occurrence of the last n tokens
and drafts the tokens that followed the most recent such occurrence (recent text predicts
the continuation better than the first occurrence does in generated output).
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


class NgramProposer(Proposer):
    """Prompt lookup over the request's own prompt + output."""

    name = "ngram"

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        return [
            ngram_draft(
                np.asarray(r.token_ids, dtype=np.int64), self.ngram_min, self.ngram_max, r.max_draft
            )
            for r in requests
        ]
