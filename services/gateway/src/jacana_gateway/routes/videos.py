"""/v1/videos: OpenAI's Videos API over the multimodal services' gRPC API
(``jacana.multimodal.v1.Multimodal``).

- ``POST /v1/videos``: a new render job (multipart/form-data or JSON,
  :mod:`jacana_gateway.schemas.videos`), on a replica of its model; ``model`` unset: the
  first video model configured. An unknown model is a 404 ``model_not_found``, a model of
  another kind a 400 ``model_not_supported``.
- ``GET /v1/videos`` (``after``, ``limit`` 1..100, ``order``), ``GET`` and ``DELETE
  /v1/videos/{video_id}``, ``GET /v1/videos/{video_id}/content?variant=`` (the artifact's
  bytes, streamed) and ``POST /v1/videos/{video_id}/remix``: on any replica (they share
  one job store, :mod:`jacana_gateway.backends.videos`).

While a video is queued or in progress, ``GET /v1/videos/{video_id}`` carries the header
``openai-poll-after-ms`` (``video_poll_after_ms``), which the SDK's poll helper waits for.
The service's failures become OpenAI errors there: RESOURCE_EXHAUSTED -> 429 with
``Retry-After``, FAILED_PRECONDITION -> 400 (``video_not_ready``), NOT_FOUND -> 404,
unreachable -> 503. A body over ``max_video_body_bytes`` is a 413 from the body limit. A
client that disconnects cancels the gRPC call.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from jacana_common.errors import ApiError
from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2 as pb
from jacana_gateway.errors import ERROR_RESPONSES, model_not_found, model_not_supported
from jacana_gateway.middleware.disconnect import WatchedStreamingResponse, cancel_on_disconnect
from jacana_gateway.schemas.videos import (
    REFERENCE,
    VideoFields,
    VideoRemixRequest,
    read_create_request,
)
from jacana_gateway.state import GatewayState
from jacana_gateway.translate.videos import (
    PENDING,
    VARIANTS,
    create_video_request,
    trace_context,
    video_deleted,
    video_list,
    video_object,
)

T = TypeVar("T")

POLL_AFTER_HEADER = "openai-poll-after-ms"
MAX_VIDEO_ID_CHARS = 256


def _create_body_schema() -> dict[str, Any]:
    """The create request in the OpenAPI document, as a form and as JSON (the handler
    reads the body itself)."""
    fields = VideoFields.model_json_schema() | {
        "title": "VideoCreateRequest",
        "description": "A new video: OpenAI's fields and Jacana's extensions.",
    }
    form = {
        **fields,
        "properties": {
            **fields["properties"],
            REFERENCE: {"type": "string", "format": "binary", "description": "An image."},
        },
    }
    reference = {
        "type": "object",
        "properties": {"image_url": {"type": "string", "description": "A data:image/ URL."}},
        "required": ["image_url"],
    }
    body = {**fields, "properties": {**fields["properties"], REFERENCE: reference}}
    content = {"multipart/form-data": {"schema": form}, "application/json": {"schema": body}}
    return {"requestBody": {"required": True, "content": content}}


def build_router(state: GatewayState) -> APIRouter:
    """The /v1/videos routes served by ``state.videos``."""
    router = APIRouter(prefix="/v1/videos", tags=["openai"])
    services, timeout_s = state.videos, state.settings.request_timeout_s
    poll_after = {POLL_AFTER_HEADER: str(state.settings.video_poll_after_ms)}

    def model_for(requested: str | None) -> str:
        if requested is None:
            if not services.models:
                raise ApiError(404, "No video model is served here.", "model", "model_not_found")
            return services.models[0]
        if requested not in services:
            route = state.route_for(requested)
            if route is None:
                raise model_not_found(requested)
            raise model_not_supported(requested, "not a video model", route)
        return requested

    def served(video_id: str) -> None:
        """Refuse a video id no video model can know before calling anyone."""
        if not services.models or len(video_id) > MAX_VIDEO_ID_CHARS:
            raise ApiError(404, f"No video with id '{video_id[:64]}'.", None, "not_found")

    async def call(request: Request, pending: Awaitable[T]) -> T:
        async with cancel_on_disconnect(request.receive):
            return await pending

    @router.post(
        "", response_model=None, responses=ERROR_RESPONSES, openapi_extra=_create_body_schema()
    )
    async def create_video(request: Request) -> JSONResponse:
        """Queue a render of a prompt (and optionally an image the first frame starts
        from); the video comes back in status ``queued``."""
        body = await read_create_request(request)
        model = model_for(body.fields.model)
        grpc_request = create_video_request(body, model, trace_context(request.headers))
        video = await call(request, services.create_video(model, grpc_request, timeout_s))
        return JSONResponse(video_object(video))

    @router.get("", response_model=None, responses=ERROR_RESPONSES)
    async def list_videos(
        request: Request,
        after: Annotated[str | None, Query(max_length=MAX_VIDEO_ID_CHARS)] = None,
        limit: Annotated[int | None, Query(ge=1, le=100)] = None,
        order: Literal["asc", "desc"] | None = None,
    ) -> JSONResponse:
        """A page of videos, newest first unless ``order`` is ``asc``; ``after`` is the
        last id of the previous page."""
        if not services.models:
            return JSONResponse(video_list(pb.ListVideosResponse()))
        grpc_request = pb.ListVideosRequest(after=after or "", limit=limit or 0, order=order or "")
        reply = await call(request, services.list_videos(grpc_request, timeout_s))
        return JSONResponse(video_list(reply))

    @router.get("/{video_id}", response_model=None, responses=ERROR_RESPONSES)
    async def retrieve_video(request: Request, video_id: str) -> JSONResponse:
        """One video's status and progress."""
        served(video_id)
        grpc_request = pb.GetVideoRequest(video_id=video_id)
        video = await call(request, services.get_video(grpc_request, timeout_s))
        headers = poll_after if video.status in PENDING else None
        return JSONResponse(video_object(video), headers=headers)

    @router.delete("/{video_id}", response_model=None, responses=ERROR_RESPONSES)
    async def delete_video(request: Request, video_id: str) -> JSONResponse:
        """Delete a video and its files; a render still queued or running is cancelled."""
        served(video_id)
        grpc_request = pb.DeleteVideoRequest(video_id=video_id)
        reply = await call(request, services.delete_video(grpc_request, timeout_s))
        return JSONResponse(video_deleted(reply, video_id))

    @router.get(
        "/{video_id}/content",
        response_model=None,
        responses={**ERROR_RESPONSES, 200: {"content": {"video/mp4": {}, "image/webp": {}}}},
    )
    async def download_video_content(
        request: Request,
        video_id: str,
        variant: Literal["video", "thumbnail", "spritesheet"] = "video",
    ) -> Response:
        """The MP4 of a completed video, or its ``thumbnail`` (WebP) or ``spritesheet``
        (JPEG); a video that is not completed is a 400 ``video_not_ready``."""
        served(video_id)
        grpc_request = pb.GetVideoContentRequest(video_id=video_id, variant=VARIANTS[variant])
        stream = await call(request, services.open_content(grpc_request, timeout_s))
        # The size is known from the first chunk; without it the body goes chunked.
        length = {"Content-Length": str(stream.total_bytes)} if stream.total_bytes else None
        return WatchedStreamingResponse(
            stream.chunks(), on_close=[stream.close], headers=length, media_type=stream.content_type
        )

    @router.post("/{video_id}/remix", response_model=None, responses=ERROR_RESPONSES)
    async def remix_video(request: Request, video_id: str, body: VideoRemixRequest) -> JSONResponse:
        """A new render of a completed video's request under a new prompt."""
        served(video_id)
        grpc_request = pb.RemixVideoRequest(
            video_id=video_id, prompt=body.prompt, trace_context=trace_context(request.headers)
        )
        video = await call(request, services.remix_video(grpc_request, timeout_s))
        return JSONResponse(video_object(video))

    return router
