"""The gRPC servicer of ``jacana.drafter.v1.Drafter``: one :class:`DraftSession` per
stream, steps answered in order on the stream's own task."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from jacana_common.pb.jacana.drafter.v1 import drafter_pb2, drafter_pb2_grpc
from jacana_drafter.session import DraftSession, SessionError
from jacana_drafter.settings import DrafterSettings
from jacana_engine.spec.proposer import Proposer
from jacana_engine.spec.registry import create_local_proposer

log = logging.getLogger(__name__)


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    def __init__(self, settings: DrafterSettings) -> None:
        self.settings = settings
        self.num_streams = 0

    def _build(self, proposer: str) -> Proposer:
        return create_local_proposer(self.settings.speculative_config(proposer))

    async def Draft(  # the gRPC method name
        self,
        request_iterator: AsyncIterator[drafter_pb2.DraftStep],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[drafter_pb2.DraftReply]:
        if self.num_streams >= self.settings.max_streams:
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
