"""The remote transport: a :class:`Proposer` that asks the drafter service over one
bidirectional gRPC stream (``jacana.drafter.v1.Drafter/Draft``), one message per step.

Ownership: the engine thread calls :meth:`RemoteProposer.propose`; one reader thread per
stream moves replies into that stream's queue. Host-side only.

Failure policy: speculation is an optimisation, so the drafter can never fail a request.
A reply later than ``deadline_s`` is given up on (that step decodes without drafts; the
late reply is dropped by its ``step_id``); a broken stream (drafter down, restarted) is
dropped with all its state, the engine decodes without drafts, and a new stream is tried
every ``retry_interval_s``, resending full histories once it is up.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import grpc

from jacana_common.grpc_client import CHANNEL_OPTIONS
from jacana_common.pb.jacana.drafter.v1 import drafter_pb2, drafter_pb2_grpc
from jacana_engine.spec.proposer import DraftRequest, Proposer

log = logging.getLogger(__name__)

_BROKEN = object()  # a reader thread's last word: the stream ended or failed


class _Stream:
    """One open Draft call: its outbox (request iterator) and its replies."""

    def __init__(self, stub: drafter_pb2_grpc.DrafterStub) -> None:
        self.outbox: queue.Queue = queue.Queue()
        self.replies: queue.Queue = queue.Queue()
        self.call = stub.Draft(self._requests())
        threading.Thread(target=self._read, name="drafter-reader", daemon=True).start()

    def _requests(self) -> Iterator[drafter_pb2.DraftStep]:
        while (step := self.outbox.get()) is not None:
            yield step

    def _read(self) -> None:
        try:
            for reply in self.call:
                self.replies.put(reply)
        except grpc.RpcError as exc:
            log.warning("drafter stream failed: %s", exc.code())
        self.replies.put(_BROKEN)

    def close(self) -> None:
        self.outbox.put(None)
        self.call.cancel()


class RemoteProposer(Proposer):
    """Drafts from the drafter service; returns empty drafts whenever it cannot."""

    def __init__(
        self,
        address: str,
        proposer: str,
        deadline_s: float = 0.05,
        retry_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = proposer
        self.address = address
        self.deadline_s = deadline_s
        self.retry_interval_s = retry_interval_s
        self._clock = clock
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = drafter_pb2_grpc.DrafterStub(self._channel)
        self._stream: _Stream | None = None
        self._retry_at = 0.0
        self._step_id = 0
        self._sent: dict[str, int] = {}  # tokens of each request the stream already has
        # Final deltas of requests that finished since the last step (DraftStep.finished).
        self._finished: list[drafter_pb2.RequestDelta] = []
        self.num_timeouts = 0
        self.num_disconnects = 0

    @property
    def connected(self) -> bool:
        return self._stream is not None

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        empty: list[list[int]] = [[] for _ in requests]
        stream = self._open()
        if stream is None:
            return empty
        self._step_id += 1
        step = drafter_pb2.DraftStep(
            step_id=self._step_id, proposer=self.name, finished=self._finished
        )
        self._finished = []
        for r in requests:
            sent = self._sent.get(r.request_id)
            step.requests.append(
                drafter_pb2.RequestDelta(
                    request_id=r.request_id,
                    token_ids=r.token_ids if sent is None else r.token_ids[sent:],
                    full_history=sent is None,
                    num_prompt_tokens=r.num_prompt_tokens,
                    max_draft=r.max_draft,
                )
            )
            self._sent[r.request_id] = len(r.token_ids)
        stream.outbox.put(step)
        return self._await(stream, self._step_id, len(requests)) or empty

    def _await(self, stream: _Stream, step_id: int, n: int) -> list[list[int]] | None:
        deadline = self._clock() + self.deadline_s
        while True:
            try:
                reply = stream.replies.get(timeout=max(0.0, deadline - self._clock()))
            except queue.Empty:
                self.num_timeouts += 1
                return None
            if reply is _BROKEN:
                self._drop(stream)
                return None
            if reply.step_id == step_id and len(reply.drafts) == n:
                return [list(d.token_ids) for d in reply.drafts]
            # an answer to a step given up on earlier: skip it

    def _open(self) -> _Stream | None:
        if self._stream is None and self._clock() >= self._retry_at:
            self._stream = _Stream(self._stub)
        return self._stream

    def _drop(self, stream: _Stream) -> None:
        """Forget a broken stream and everything the drafter held for it."""
        stream.close()
        if self._stream is stream:
            self._stream = None
            self._sent.clear()
            self._finished.clear()
            self._retry_at = self._clock() + self.retry_interval_s
            self.num_disconnects += 1

    def finish(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        """Queue the request's final tokens for the next step, so the drafter's proposer
        learns from the same history an in-process one would (also for requests that
        never drafted)."""
        if self._stream is None:
            return  # a new stream starts with no state: nothing to learn from or drop
        sent = self._sent.pop(request_id, None)
        self._finished.append(
            drafter_pb2.RequestDelta(
                request_id=request_id,
                token_ids=token_ids if sent is None else token_ids[sent:],
                full_history=sent is None,
                num_prompt_tokens=num_prompt_tokens,
            )
        )

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._channel.close()
