"""/v1/videos between OpenAI and gRPC, as pure functions: the CreateVideoRequest for a
checked body, and the video, list and deletion objects.

OpenAI's own SDK types are the oracle for the shapes: they parse what we send, and every
field they define is there."""

from __future__ import annotations

from openai.types import Video, VideoDeleteResponse

from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2 as pb
from jacana_gateway.schemas.videos import VideoCreate, VideoFields
from jacana_gateway.translate.videos import (
    create_video_request,
    trace_context,
    video_deleted,
    video_list,
    video_object,
)

VIDEO = pb.Video(
    id="video_1",
    model="wan",
    status="completed",
    progress=100,
    created_at=10,
    completed_at=20,
    expires_at=30,
    seconds="4",
    size="1280x720",  # one of the SDK's literal sizes, so that its type validates strictly
    prompt="a heron",
    seed=5,
    num_inference_steps=8,
    guidance_scale=5.0,
    fps=16,
)


def test_create_request_sets_only_what_was_given():
    fields = VideoFields(prompt="p", seed=0, guidance_scale=0.0, negative_prompt="blur")
    body = VideoCreate(fields, b"img", "a.png")
    request = create_video_request(body, "wan", {"traceparent": "00-x"})
    assert (request.model, request.prompt, request.seconds, request.size) == ("wan", "p", "", "")
    assert request.HasField("seed") and request.seed == 0  # zero is a value, not unset
    assert request.HasField("guidance_scale") and request.guidance_scale == 0.0
    assert not request.HasField("num_inference_steps") and not request.HasField("fps")
    assert (request.input_reference, request.input_reference_name) == (b"img", "a.png")
    assert request.negative_prompt == "blur"
    assert dict(request.trace_context) == {"traceparent": "00-x"}


def test_trace_context_takes_the_w3c_headers_present():
    headers = {"traceparent": "00-a", "tracestate": "", "x-other": "1"}
    assert trace_context(headers) == {"traceparent": "00-a"}


def test_the_video_object_parses_as_the_sdks_video():
    shown = video_object(VIDEO)
    parsed = Video.model_validate(shown)
    assert set(Video.model_fields) <= set(shown)
    assert (parsed.status, parsed.completed_at, parsed.remixed_from_video_id) == (
        "completed",
        20,
        None,
    )
    assert parsed.model_extra == {
        "seed": 5,
        "num_inference_steps": 8,
        "guidance_scale": 5.0,
        "fps": 16,
        "negative_prompt": None,
    }
    pending = pb.Video(id="v", status="queued", notice="random weights")
    shown = video_object(pending)
    assert (shown["completed_at"], shown["error"], shown["notice"]) == (
        None,
        None,
        "random weights",
    )
    failed = pb.Video()
    failed.CopyFrom(VIDEO)
    failed.status = "failed"
    failed.ClearField("completed_at")
    failed.error.CopyFrom(pb.VideoError(code="c", message="m"))
    assert Video.model_validate(video_object(failed)).error.code == "c"


def test_list_and_deleted_objects():
    page = video_list(pb.ListVideosResponse(data=[VIDEO, pb.Video(id="video_0")], has_more=True))
    assert (page["object"], page["first_id"], page["last_id"], page["has_more"]) == (
        "list",
        "video_1",
        "video_0",
        True,
    )
    deleted = video_deleted(pb.DeleteVideoResponse(id="video_1", deleted=True), "video_1")
    assert VideoDeleteResponse.model_validate(deleted).deleted is True
