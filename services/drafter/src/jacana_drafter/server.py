"""The gRPC servicer of ``jacana.drafter.v1.Drafter``: one :class:`DraftSession` per
stream, steps answered in order on the stream's own task.

It needs only grpc, the stubs and the proposers (no settings library), so a benchmark can
serve the very same stream handling from a bare process.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import grpc

from jacana_common.pb.jacana.drafter.v1 import drafter_pb2, drafter_pb2_grpc
from jacana_drafter.session import DraftSession, SessionError
from jacana_engine.spec.proposer import Proposer

log = logging.getLogger(__name__)

BuildProposer = Callable[[str], Proposer]  # proposer name -> a fresh proposer (ValueError)


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    """build: makes each stream's proposer from the name its first message carries;
    max_streams: more concurrent streams than this are refused."""

    def __init__(self, build: BuildProposer, max_streams: int) -> None:
        self._build = build
        self.max_streams = max_streams
        self.num_streams = 0

    async def Draft(  # the gRPC method name
        self,
        request_iterator: AsyncIterator[drafter_pb2.DraftStep],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[drafter_pb2.DraftReply]:
        if self.num_streams >= self.max_streams:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many engine streams")
        self.num_streams += 1
        try:
            session: DraftSession | None = None
            async for step in request_iterator:
                try:
                    if session is None:
                        session = DraftSession.start(step, self._build)
                        log.info("stream opened: proposer %s", step.proposer)
                    reply = session.handle(step)
                except SessionError as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                yield reply
        finally:
            self.num_streams -= 1
