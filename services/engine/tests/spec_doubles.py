"""Proposers for speculation tests: drafts of a known (bad) quality at a known cost."""

from __future__ import annotations

import time

from jacana_engine.spec.proposer import Proposer


class SlowWrongProposer(Proposer):
    """Drafts tokens the toy model never picks, and takes 20 ms doing it: speculation
    that only costs."""

    name = "slow-wrong"

    def __init__(self, vocab: int) -> None:
        self.vocab, self.calls = vocab, 0

    def propose(self, requests):
        self.calls += 1
        time.sleep(0.02)
        return [[(r.token_ids[-1] + 1) % self.vocab] * r.max_draft for r in requests]
