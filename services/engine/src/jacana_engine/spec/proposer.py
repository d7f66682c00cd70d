"""The proposer interface: what every draft source (n-gram, suffix, draft model) implements.

A proposer is host-side state owned by whoever runs it (the engine's speculator in
process, or the drafter service). It sees requests by id, gets each one's full token
history (prompt + output) once per step, and is told when a request is gone so it can
drop (or learn from) its state. It never sees logits or the KV cache of the target.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DraftRequest:
    """One request's share of a drafting step.

    request_id: the engine's id, stable for the request's lifetime.
    token_ids: prompt + output so far (the last one is the token the target reads next).
    num_prompt_tokens: how many of ``token_ids`` are the prompt.
    max_draft: most draft tokens wanted (>= 1).
    """

    request_id: str
    token_ids: Sequence[int]
    num_prompt_tokens: int
    max_draft: int


class Proposer(ABC):
    """Drafts continuations for a batch of requests.

    Contract: ``propose`` returns one list per request, in order, each at most
    ``max_draft`` long (empty when it has no guess). It must be deterministic given the
    same history, and cheap next to a target forward pass.
    """

    name: str = ""

    @abstractmethod
    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        """Draft tokens per request."""

    def finish(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:  # noqa: B027
        """The request is done (finished or aborted): drop its state. ``token_ids`` is its
        final history, for proposers that learn from past requests. Default: nothing."""

    def warm_up(self) -> float:
        """Run, on dummy requests, the work whose first run would compile kernels (a
        proposer with a model of its own), leaving no state behind; returns the wall
        seconds. Default: nothing to run."""
        return 0.0
