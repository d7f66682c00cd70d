"""/v1/videos between OpenAI and gRPC: the multimodal service's requests for checked
bodies, and its replies as OpenAI's Videos API shows them. Pure functions, no I/O.

The video object is OpenAI's ``{id, object: "video", model, status, progress, created_at,
completed_at, expires_at, seconds, size, prompt, remixed_from_video_id, error}``
(``completed_at``, ``remixed_from_video_id``, ``error`` null while unset) plus Jacana's
extensions: what the render used (``seed``, ``num_inference_steps``, ``guidance_scale``,
``fps``, ``negative_prompt``, null when empty) and ``notice`` only when the service sets
one (a model with random weights says its frames are noise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2 as pb
from jacana_gateway.schemas.videos import VideoCreate

# The ``variant`` query values of GET /v1/videos/{video_id}/content.
VARIANTS = {
    "video": pb.CONTENT_VARIANT_VIDEO,
    "thumbnail": pb.CONTENT_VARIANT_THUMBNAIL,
    "spritesheet": pb.CONTENT_VARIANT_SPRITESHEET,
}
# The statuses a poller should ask again about.
PENDING = frozenset({"queued", "in_progress"})
# W3C trace context headers, passed on with a job so its render joins the caller's trace.
TRACE_HEADERS = ("traceparent", "tracestate")


def trace_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace context headers of a request (those present and non-empty)."""
    return {name: value for name in TRACE_HEADERS if (value := headers.get(name, ""))}


def create_video_request(
    body: VideoCreate, model: str, trace: Mapping[str, str]
) -> pb.CreateVideoRequest:
    """``body`` as the service's CreateVideoRequest for ``model``; unset extensions stay
    unset (the model's defaults)."""
    fields = body.fields
    request = pb.CreateVideoRequest(
        model=model,
        prompt=fields.prompt,
        seconds=fields.seconds or "",
        size=fields.size or "",
        input_reference=body.input_reference,
        input_reference_name=body.input_reference_name,
        negative_prompt=fields.negative_prompt or "",
        trace_context=dict(trace),
    )
    for name in ("seed", "num_inference_steps", "guidance_scale", "fps"):
        value = getattr(fields, name)
        if value is not None:
            setattr(request, name, value)
    return request


def video_object(video: pb.Video) -> dict[str, Any]:
    """One video as OpenAI shows it, with Jacana's extensions."""
    error = None
    if video.HasField("error"):
        error = {"code": video.error.code, "message": video.error.message}
    shown: dict[str, Any] = {
        "id": video.id,
        "object": "video",
        "model": video.model,
        "status": video.status,
        "progress": int(video.progress),
        "created_at": video.created_at,
        "completed_at": video.completed_at if video.HasField("completed_at") else None,
        "expires_at": video.expires_at,
        "seconds": video.seconds,
        "size": video.size,
        "prompt": video.prompt,
        "remixed_from_video_id": video.remixed_from_video_id or None,
        "error": error,
        "seed": video.seed,
        "num_inference_steps": video.num_inference_steps,
        "guidance_scale": video.guidance_scale,
        "fps": video.fps,
        "negative_prompt": video.negative_prompt or None,
    }
    if video.notice:
        shown["notice"] = video.notice
    return shown


def video_list(reply: pb.ListVideosResponse) -> dict[str, Any]:
    """A page of videos as OpenAI's cursor page: ``first_id``/``last_id`` null when empty."""
    data = [video_object(v) for v in reply.data]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": reply.has_more,
    }


def video_deleted(reply: pb.DeleteVideoResponse, video_id: str) -> dict[str, Any]:
    return {"id": reply.id or video_id, "object": "video.deleted", "deleted": reply.deleted}
