"""The gRPC front of ``VideoJobs``: ``jacana.multimodal.v1.Multimodal``.

Each RPC runs the blocking service call on a thread and maps the service's errors to one
status each, with the blamed field in the details (``jacana_common.errors.grpc_details``):
``InvalidVideoRequest`` -> INVALID_ARGUMENT, ``NotFound`` -> NOT_FOUND, ``NotReady`` ->
FAILED_PRECONDITION, ``QueueFull`` -> RESOURCE_EXHAUSTED with trailing metadata
``retry-after``, Redis unreachable -> UNAVAILABLE. Anything else is a bug: logged with its
traceback and answered INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import grpc
import redis

from jacana_common.errors import grpc_details
from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2 as pb
from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2_grpc
from jacana_multimodal.errors import (
    InvalidVideoRequest,
    NotFound,
    NotReady,
    QueueFull,
    VideoServiceError,
)
from jacana_multimodal.service import CreateRequest, VideoJobs, VideoView

log = logging.getLogger(__name__)

T = TypeVar("T")

_STATUS = {
    InvalidVideoRequest: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    NotReady: grpc.StatusCode.FAILED_PRECONDITION,
    QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
}
_VARIANT_NAMES = {
    pb.CONTENT_VARIANT_VIDEO: "video",
    pb.CONTENT_VARIANT_THUMBNAIL: "thumbnail",
    pb.CONTENT_VARIANT_SPRITESHEET: "spritesheet",
}


def video_message(view: VideoView) -> pb.Video:
    record, params = view.record, view.params
    message = pb.Video(
        id=record.id,
        model=record.model,
        # A cancelled job is deleted at once; between the two it reads as failed.
        status="failed" if record.status.value == "cancelled" else record.status.value,
        progress=view.progress,
        created_at=int(record.created_at),
        expires_at=int(record.expires_at),
        seconds=str(params.seconds),
        size=params.size,
        prompt=params.prompt,
        remixed_from_video_id=params.remixed_from,
        seed=params.seed,
        num_inference_steps=params.num_inference_steps,
        guidance_scale=params.guidance_scale,
        fps=params.fps,
        negative_prompt=params.negative_prompt,
        notice=view.notice,
    )
    if record.completed_at is not None:
        message.completed_at = int(record.completed_at)
    if record.error is not None:
        message.error.CopyFrom(pb.VideoError(code=record.error.code, message=record.error.message))
    return message


class MultimodalServicer(multimodal_pb2_grpc.MultimodalServicer):
    def __init__(self, jobs: VideoJobs) -> None:
        self.jobs = jobs

    async def _call(self, context: grpc.aio.ServicerContext, fn: Callable[..., T], *args) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except VideoServiceError as exc:
            if isinstance(exc, QueueFull):
                context.set_trailing_metadata((("retry-after", str(exc.retry_after_s)),))
            await context.abort(_STATUS[type(exc)], grpc_details(exc.message, exc.param, exc.code))
        except redis.RedisError as exc:
            log.warning("redis unavailable: %s", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"job store unavailable: {exc}")
        except Exception:
            log.exception("%s failed", getattr(fn, "__name__", fn))
            await context.abort(grpc.StatusCode.INTERNAL, "internal error in the video service")
        raise AssertionError("unreachable")  # abort raises

    async def CreateVideo(self, request: pb.CreateVideoRequest, context) -> pb.Video:
        create = CreateRequest(
            model=request.model,
            prompt=request.prompt,
            seconds=request.seconds,
            size=request.size,
            input_reference=request.input_reference,
            negative_prompt=request.negative_prompt,
            seed=request.seed if request.HasField("seed") else None,
            num_inference_steps=(
                request.num_inference_steps if request.HasField("num_inference_steps") else None
            ),
            guidance_scale=request.guidance_scale if request.HasField("guidance_scale") else None,
            fps=request.fps if request.HasField("fps") else None,
            trace_context=dict(request.trace_context),
        )
        return video_message(await self._call(context, self.jobs.create, create))

    async def GetVideo(self, request: pb.GetVideoRequest, context) -> pb.Video:
        return video_message(await self._call(context, self.jobs.get, request.video_id))

    async def ListVideos(self, request: pb.ListVideosRequest, context) -> pb.ListVideosResponse:
        views, has_more = await self._call(
            context, self.jobs.list, request.after, request.limit or 20, request.order or "desc"
        )
        return pb.ListVideosResponse(data=[video_message(v) for v in views], has_more=has_more)

    async def DeleteVideo(self, request: pb.DeleteVideoRequest, context) -> pb.DeleteVideoResponse:
        video_id = await self._call(context, self.jobs.delete, request.video_id)
        return pb.DeleteVideoResponse(id=video_id, deleted=True)

    async def RemixVideo(self, request: pb.RemixVideoRequest, context) -> pb.Video:
        view = await self._call(
            context, self.jobs.remix, request.video_id, request.prompt, dict(request.trace_context)
        )
        return video_message(view)

    async def GetVideoContent(
        self, request: pb.GetVideoContentRequest, context
    ) -> AsyncIterator[pb.ContentChunk]:
        variant = _VARIANT_NAMES.get(request.variant, "")
        content_type, size, chunks = await self._call(
            context, self.jobs.content, request.video_id, variant
        )
        first = True
        while (block := await asyncio.to_thread(next, chunks, None)) is not None:
            if first:
                yield pb.ContentChunk(data=block, content_type=content_type, total_bytes=size)
                first = False
            else:
                yield pb.ContentChunk(data=block)
        if first:  # an empty file still says what it is
            yield pb.ContentChunk(content_type=content_type, total_bytes=0)

    async def ListModels(self, request: pb.ListModelsRequest, context) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(
            models=[
                pb.ModelCard(
                    id=c.id,
                    architecture=c.architecture,
                    sizes=list(c.sizes),
                    seconds=list(c.seconds),
                    default_size=c.default_size,
                    default_seconds=c.default_seconds,
                    default_fps=c.default_fps,
                    image_to_video=c.image_to_video,
                    random_weights=c.random_weights,
                    description=c.description,
                )
                for c in self.jobs.cards.values()
            ]
        )
