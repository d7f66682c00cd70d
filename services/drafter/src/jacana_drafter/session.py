"""One engine stream's drafting state: the proposer and each request's token history.

Owned by the stream's handler (one asyncio task); nothing is shared between streams, so
two engines never see each other's request ids. Pure host-side logic, tested without
gRPC.
"""

from __future__ import annotations

from collections.abc import Callable

from jacana_common.pb.jacana.drafter.v1 import drafter_pb2
from jacana_engine.spec.proposer import DraftRequest, Proposer


class SessionError(ValueError):
    """The engine sent something this session cannot apply (a protocol error)."""


class DraftSession:
    """Applies a stream's DraftSteps in order and answers each with its drafts."""

    def __init__(self, proposer: Proposer) -> None:
        self.proposer = proposer
        self._histories: dict[str, list[int]] = {}
        self._num_prompt: dict[str, int] = {}

    @classmethod
    def start(cls, first: drafter_pb2.DraftStep, build: Callable[[str], Proposer]) -> DraftSession:
        """A session for the proposer the stream's first message names."""
        try:
            return cls(build(first.proposer))
        except ValueError as exc:
            raise SessionError(str(exc)) from None

    @property
    def num_requests(self) -> int:
        return len(self._histories)

    def handle(self, step: drafter_pb2.DraftStep) -> drafter_pb2.DraftReply:
        for delta in step.finished:
            rid = delta.request_id
            history = self._histories.pop(rid, None)
            num_prompt = self._num_prompt.pop(rid, delta.num_prompt_tokens)
            if delta.full_history:
                history, num_prompt = list(delta.token_ids), delta.num_prompt_tokens
            elif history is None:
                raise SessionError(f"{rid}: final delta before its full history")
            else:
                history.extend(delta.token_ids)
            self.proposer.finish(rid, history, num_prompt)
        for rid in step.finished_request_ids:  # ids alone: learn from what was sent
            history = self._histories.pop(rid, None)
            if history is not None:
                self.proposer.finish(rid, history, self._num_prompt.pop(rid))
        requests = []
        for delta in step.requests:
            if delta.max_draft < 1:
                raise SessionError(f"{delta.request_id}: max_draft must be >= 1")
            if delta.full_history:
                history = self._histories[delta.request_id] = list(delta.token_ids)
                self._num_prompt[delta.request_id] = delta.num_prompt_tokens
            else:
                history = self._histories.get(delta.request_id)
                if history is None:
                    raise SessionError(f"{delta.request_id}: delta before its full history")
                history.extend(delta.token_ids)
            if not history:
                raise SessionError(f"{delta.request_id}: empty history")
            requests.append(
                DraftRequest(
                    delta.request_id, history, self._num_prompt[delta.request_id], delta.max_draft
                )
            )
        drafts = self.proposer.propose(requests) if requests else []
        return drafter_pb2.DraftReply(
            step_id=step.step_id,
            drafts=[
                drafter_pb2.Draft(token_ids=d[: r.max_draft])
                for d, r in zip(drafts, requests, strict=True)
            ],
        )
