"""The Draft stream over real gRPC: a ``python -m jacana_drafter`` process and the engine's
:class:`RemoteProposer`, including the drafter going away and coming back."""

from __future__ import annotations

import time

from jacana_engine.spec.proposer import DraftRequest
from jacana_engine.spec.remote import RemoteProposer

HISTORY = [5, 6, 7, 8, 9, 5, 6, 7]


def _req(rid, tokens, k=3, n_prompt=2):
    return DraftRequest(rid, tokens, n_prompt, k)


def test_remote_ngram_drafts_equal_local_ones(drafter):
    remote = RemoteProposer(drafter.address, "ngram", deadline_s=5.0)
    try:
        assert remote.propose([_req("a", HISTORY), _req("b", [1, 2])]) == [[8, 9, 5], []]
        # incremental: only the new tokens travel, the drafter extends its copy
        assert remote.propose([_req("a", [*HISTORY, 8, 9])]) == [[5, 6, 7]]
        assert remote._sent == {"a": 10, "b": 2}
        remote.finish("a", [*HISTORY, 8, 9], 2)
        assert remote.propose([_req("b", [1, 2, 1])]) == [[2, 1]]
        assert remote.num_timeouts == 0 and remote.connected
    finally:
        remote.close()


def test_suffix_learns_across_requests_on_one_stream(drafter):
    remote = RemoteProposer(drafter.address, "suffix", deadline_s=5.0)
    try:
        remote.propose([_req("a", [1, 2, 40, 41, 42, 43])])
        remote.finish("a", [1, 2, 40, 41, 42, 43], 2)
        assert remote.propose([_req("b", [3, 4, 40, 41])]) == [[42, 43]]
    finally:
        remote.close()


def test_drafter_down_gives_empty_drafts_then_recovers(drafter):
    remote = RemoteProposer(drafter.address, "ngram", deadline_s=5.0, retry_interval_s=0.2)
    try:
        assert remote.propose([_req("a", HISTORY)]) == [[8, 9, 5]]
        drafter.kill()
        start = time.monotonic()
        assert remote.propose([_req("a", [*HISTORY, 8])]) == [[]]
        assert time.monotonic() - start < 5.0  # a broken stream is noticed, not waited out
        assert not remote.connected and remote.num_disconnects == 1
        assert remote.propose([_req("a", [*HISTORY, 8])]) == [[]]  # before the retry time
        drafter.start()
        time.sleep(0.3)
        # the new stream gets the full history again
        assert remote.propose([_req("a", [*HISTORY, 8])]) == [[9, 5, 6]]
        assert remote.connected
    finally:
        remote.close()
