"""DraftSession: the per-stream protocol (incremental histories, finished requests)."""

from __future__ import annotations

import pytest

from jacana_common.pb.jacana.drafter.v1 import drafter_pb2 as pb
from jacana_drafter.session import DraftSession, SessionError
from jacana_drafter.settings import DrafterSettings
from jacana_engine.spec.proposer import Proposer
from jacana_engine.spec.registry import create_local_proposer


class Recorder(Proposer):
    """Drafts the last two tokens back and records what it saw."""

    name = "recorder"

    def __init__(self):
        self.seen, self.finished = [], []

    def propose(self, requests):
        self.seen.append([(r.request_id, list(r.token_ids), r.num_prompt_tokens) for r in requests])
        return [list(r.token_ids[-2:]) * 3 for r in requests]

    def finish(self, request_id, token_ids, num_prompt_tokens):
        self.finished.append((request_id, list(token_ids), num_prompt_tokens))


def _delta(rid, tokens, full, k=4, n_prompt=0):
    return pb.RequestDelta(
        request_id=rid, token_ids=tokens, full_history=full, num_prompt_tokens=n_prompt, max_draft=k
    )


def test_histories_are_rebuilt_from_deltas_and_drafts_capped():
    rec = Recorder()
    s = DraftSession(rec)
    r1 = s.handle(pb.DraftStep(step_id=1, requests=[_delta("a", [1, 2, 3], True, n_prompt=2)]))
    assert r1.step_id == 1 and [list(d.token_ids) for d in r1.drafts] == [[2, 3, 2, 3]]
    r2 = s.handle(
        pb.DraftStep(step_id=2, requests=[_delta("a", [4, 5], False, k=1), _delta("b", [9], True)])
    )
    assert [list(d.token_ids) for d in r2.drafts] == [[4], [9, 9, 9]]
    assert rec.seen[-1] == [("a", [1, 2, 3, 4, 5], 2), ("b", [9], 0)]
    s.handle(pb.DraftStep(step_id=3, finished_request_ids=["a", "zzz"]))
    assert rec.finished == [("a", [1, 2, 3, 4, 5], 2)]
    assert s.num_requests == 1


def test_final_deltas_complete_histories_like_an_in_process_finish():
    rec = Recorder()
    s = DraftSession(rec)
    s.handle(pb.DraftStep(step_id=1, requests=[_delta("a", [1, 2, 3], True, n_prompt=2)]))
    # "a" gained 4, 5 after its last propose; "b" never drafted: sent whole.
    s.handle(
        pb.DraftStep(
            step_id=2,
            finished=[_delta("a", [4, 5], False, k=0), _delta("b", [7, 8], True, 0, n_prompt=1)],
        )
    )
    assert rec.finished == [("a", [1, 2, 3, 4, 5], 2), ("b", [7, 8], 1)]
    assert s.num_requests == 0
    with pytest.raises(SessionError, match="final delta before its full history"):
        s.handle(pb.DraftStep(step_id=3, finished=[_delta("zzz", [1], False)]))


def test_protocol_errors():
    s = DraftSession(Recorder())
    with pytest.raises(SessionError, match="before its full history"):
        s.handle(pb.DraftStep(step_id=1, requests=[_delta("a", [1], False)]))
    with pytest.raises(SessionError, match="max_draft"):
        s.handle(pb.DraftStep(step_id=1, requests=[_delta("a", [1], True, k=0)]))
    build = lambda name: create_local_proposer(DrafterSettings().speculative_config(name))  # noqa: E731
    with pytest.raises(SessionError, match="unknown speculative proposer"):
        DraftSession.start(pb.DraftStep(proposer="nope"), build)
    assert DraftSession.start(pb.DraftStep(proposer="suffix"), build).proposer.name == "suffix"


def test_settings_validate_ngram_range():
    from jacana_common.settings import SettingsError

    with pytest.raises(SettingsError, match="NGRAM_MIN"):
        DrafterSettings.load(ngram_min=5, ngram_max=2)
