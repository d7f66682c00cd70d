"""The multimodal services (``jacana.multimodal.v1.Multimodal``) behind /v1/videos: their
replicas per video model, the video job calls routed over them, and the model cards.

Routing. A new video goes to the replicas of its model. All multimodal replicas share one
Redis job store, so the calls by video id (get, delete, remix, content) and the list may
go to any replica of any video model: they are routed under :data:`ANY_REPLICA`, the union
of every video model's endpoints (on the same channels). Least in flight first; a replica
that answers UNAVAILABLE is marked failed and the next one is tried, for every call: the
service answers UNAVAILABLE only when it could not reach Redis (it wrote nothing), and a
transport failure leaves at worst a job whose id no client saw, which expires.

Errors (:func:`video_error`): RESOURCE_EXHAUSTED is a 429 whose ``Retry-After`` header is
the trailing metadata ``retry-after`` (1 when missing or not a number); UNAVAILABLE a 503
that does not name internal addresses (they go to the log); every other status as
:func:`jacana_common.errors.api_error_from_grpc` shows it, with the service's ``param``
and ``code`` (FAILED_PRECONDITION -> 400 ``video_not_ready``, NOT_FOUND -> 404).

Content. :meth:`VideoBackends.open_content` waits for the first chunk of
``GetVideoContent`` (which carries the content type and size) before anything is sent to
the client, so a video that is not ready is a proper 400; the returned
:class:`ContentStream` owns the call until :meth:`ContentStream.close`.

Model cards. :meth:`VideoBackends.model_cards` asks each video model's replicas for
``ListModels`` and keeps the model's card for :data:`CARD_TTL_S` (a failure, shown as no
card, for :data:`RETRY_CARD_S`). The cache and the in-flight counts live in the gateway
process and change only on the event loop thread.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import grpc

from jacana_common.errors import ApiError, api_error_from_grpc
from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2 as pb
from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2_grpc
from jacana_gateway.backends.replica_pool import call_with_failover
from jacana_gateway.backends.server_stream import ServerStream, open_server_stream
from jacana_gateway.backends.shared_store import ANY_REPLICA, SharedStoreBackends
from jacana_gateway.errors import ApiErrorWithHeaders

log = logging.getLogger(__name__)

MULTIMODAL_SERVICE = "jacana.multimodal.v1.Multimodal"
CARD_TTL_S = 60.0
RETRY_CARD_S = 5.0
DEFAULT_RETRY_AFTER_S = 1


def retry_after(exc: grpc.aio.AioRpcError) -> int:
    """Whole seconds of the call's trailing ``retry-after`` metadata (rounded up); 1 when
    it is missing or not a number."""
    for key, value in exc.trailing_metadata() or ():
        if key.lower() == "retry-after":
            try:
                seconds = float(value)
            except (TypeError, ValueError):
                break
            if math.isfinite(seconds):
                return max(0, math.ceil(seconds))
            break
    return DEFAULT_RETRY_AFTER_S


def video_error(exc: grpc.aio.AioRpcError) -> ApiError:
    """A multimodal service's failure as the client sees it."""
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        log.warning("multimodal service unavailable: %s", exc.details())
        return ApiError(
            503, "The video service is unreachable; retry later.", None, "service_unavailable"
        )
    error = api_error_from_grpc(code, exc.details())
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        headers = {"Retry-After": str(retry_after(exc))}
        return ApiErrorWithHeaders(error.status, error.message, error.param, error.code, headers)
    return error


class ContentStream:
    """An open ``GetVideoContent`` call whose first chunk has arrived (its header: the
    content type and the total size)."""

    def __init__(self, stream: ServerStream) -> None:
        self.content_type: str = stream.first.content_type or "application/octet-stream"
        self.total_bytes: int = stream.first.total_bytes
        self._stream = stream

    async def chunks(self) -> AsyncIterator[bytes]:
        """The artifact's bytes, chunk by chunk. A failure past the first chunk can no
        longer change the response's status: it is logged and the body ends short of its
        Content-Length, which clients report as an incomplete download."""
        try:
            async for chunk in self._stream.messages():
                if chunk.data:
                    yield chunk.data
        except ApiError as exc:
            log.warning("video content cut off: %s", exc.message)

    def close(self) -> None:
        """Cancel the call if it still runs and stop counting it as in flight."""
        self._stream.close()


class VideoBackends(SharedStoreBackends):
    """Video model id -> multimodal service replicas, plus :data:`ANY_REPLICA` for the
    calls by video id; the job calls routed over them and the cached model cards."""

    service = MULTIMODAL_SERVICE
    stub = multimodal_pb2_grpc.MultimodalStub

    def __init__(
        self,
        targets: Mapping[str, Sequence[str]],
        *,
        retry_after_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(targets, retry_after_s=retry_after_s, clock=clock)
        self._clock = clock
        self._cards: dict[str, tuple[float, pb.ModelCard | None]] = {}

    async def _call(self, key: str, method: str, request, timeout: float):
        return await call_with_failover(
            self.pool, key, method, request, timeout, to_error=video_error
        )

    async def create_video(
        self, model: str, request: pb.CreateVideoRequest, timeout: float
    ) -> pb.Video:
        """``CreateVideo`` on a replica of ``model``. Raises :class:`ApiError`."""
        return await self._call(model, "CreateVideo", request, timeout)

    async def get_video(self, request: pb.GetVideoRequest, timeout: float) -> pb.Video:
        return await self._call(ANY_REPLICA, "GetVideo", request, timeout)

    async def list_videos(
        self, request: pb.ListVideosRequest, timeout: float
    ) -> pb.ListVideosResponse:
        return await self._call(ANY_REPLICA, "ListVideos", request, timeout)

    async def delete_video(
        self, request: pb.DeleteVideoRequest, timeout: float
    ) -> pb.DeleteVideoResponse:
        return await self._call(ANY_REPLICA, "DeleteVideo", request, timeout)

    async def remix_video(self, request: pb.RemixVideoRequest, timeout: float) -> pb.Video:
        return await self._call(ANY_REPLICA, "RemixVideo", request, timeout)

    async def open_content(
        self, request: pb.GetVideoContentRequest, timeout: float
    ) -> ContentStream:
        """Start ``GetVideoContent`` and wait for its first chunk; only while none has
        arrived, an UNAVAILABLE replica is skipped for the next. Raises :class:`ApiError`."""
        stream = await open_server_stream(
            self.pool,
            ANY_REPLICA,
            "GetVideoContent",
            request,
            timeout,
            to_error=lambda exc, _replica: video_error(exc),
            ended_early=pb.ContentChunk,  # an empty artifact
        )
        return ContentStream(stream)

    async def model_cards(self, timeout: float) -> dict[str, pb.ModelCard | None]:
        """Each video model's card from its service (None while it cannot be had)."""
        now = self._clock()
        stale = [m for m in self._models if m not in self._cards or self._cards[m][0] <= now]
        if stale:
            cards = await asyncio.gather(*(self._fetch_card(m, timeout) for m in stale))
            for model, card in zip(stale, cards, strict=True):
                keep = CARD_TTL_S if card is not None else RETRY_CARD_S
                self._cards[model] = (now + keep, card)
        return {m: self._cards[m][1] for m in self._models}

    async def _fetch_card(self, model: str, timeout: float) -> pb.ModelCard | None:
        try:
            reply = await self._call(model, "ListModels", pb.ListModelsRequest(), timeout)
        except ApiError as exc:
            log.info("no model card for %s: %s", model, exc.message)
            return None
        card = next((c for c in reply.models if c.id == model), None)
        if card is None:
            offered = ", ".join(c.id for c in reply.models)
            log.warning("the service of video model %s offers only: %s", model, offered)
        return card
