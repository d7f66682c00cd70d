"""The official ``openai`` SDK's videos resource against the real gateway, served by
uvicorn on a loopback port, in front of the fake multimodal service
(``routes/conftest.py``): what the SDK sends arrives intact, what the gateway answers
parses into the SDK's types, and its errors become the SDK's exceptions."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import openai
import pytest

from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2 as pb

# The SDK marks the videos resource deprecated (OpenAI's Sora API sunset); Jacana's is not.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

VIDEO = "wan-test"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8


@pytest.fixture
async def mm(make_multimodal):
    return await make_multimodal()


@pytest.fixture
async def sdk(make_settings, serve, mm, dead_address) -> AsyncIterator[openai.AsyncOpenAI]:
    settings = make_settings(
        {"llm": [dead_address()]}, videos={VIDEO: [mm.address]}, video_poll_after_ms=100
    )
    async with serve(settings) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        async with client:
            yield client


async def test_create_with_an_image_file_and_retrieve(sdk, mm):
    video = await sdk.videos.create(
        prompt="a heron lands",
        model=VIDEO,
        seconds="8",
        size="480x832",
        input_reference=("frame.png", PNG, "image/png"),
        extra_body={"seed": 7, "num_inference_steps": 3, "guidance_scale": 1.5},
    )
    assert (video.id, video.status, video.model, video.seconds) == ("video_1", "queued", VIDEO, "8")
    assert video.completed_at is None and video.error is None
    (sent,) = mm.servicer.requests
    assert (sent.prompt, sent.size, sent.input_reference, sent.input_reference_name) == (
        "a heron lands",
        "480x832",
        PNG,
        "frame.png",
    )
    assert (sent.seed, sent.num_inference_steps, sent.guidance_scale) == (7, 3, 1.5)
    assert not sent.HasField("fps")
    mm.servicer.videos["video_1"].status = "in_progress"
    mm.servicer.videos["video_1"].progress = 40
    got = await sdk.videos.with_raw_response.retrieve("video_1")
    assert got.headers["openai-poll-after-ms"] == "100"
    assert (got.parse().status, got.parse().progress) == ("in_progress", 40)
    assert got.parse().model_extra["seed"] == 7  # the extensions ride along


async def test_create_with_an_image_url_object(sdk, mm):
    url = "data:image/png;base64,iVBORw0KGgo="
    # In a form the SDK writes the object as ``input_reference[image_url]``.
    await sdk.videos.create(prompt="x", extra_body={"input_reference": {"image_url": url}})
    # As JSON, the shape of OpenAI's API reference.
    body = {"prompt": "y", "model": VIDEO, "input_reference": {"image_url": url}}
    video = await sdk.post("/videos", body=body, cast_to=openai.types.Video)
    assert (video.prompt, video.status) == ("y", "queued")
    assert [r.input_reference for r in mm.servicer.requests] == [b"\x89PNG\r\n\x1a\n"] * 2


async def test_poll_asks_again_while_pending_and_returns_once_completed(sdk, mm):
    video = mm.servicer.add(model=VIDEO)
    record = mm.servicer.record

    async def complete_at_the_second_get(request, context):
        await record(request, context)
        gets = sum(isinstance(r, pb.GetVideoRequest) for r in mm.servicer.requests)
        if gets == 2:
            stored = mm.servicer.videos[video.id]
            stored.status, stored.progress, stored.completed_at = "completed", 100, 5

    mm.servicer.record = complete_at_the_second_get
    done = await sdk.videos.poll(video.id)
    assert (done.status, done.progress, done.completed_at) == ("completed", 100, 5)
    assert sum(isinstance(r, pb.GetVideoRequest) for r in mm.servicer.requests) == 2


async def test_list_paginates_through_the_service(sdk, mm):
    for _ in range(5):
        mm.servicer.add(model=VIDEO)
    page = await sdk.videos.list(limit=2, order="asc")
    assert [v.id for v in page.data] == ["video_1", "video_2"] and page.has_more
    every = [v.id async for v in sdk.videos.list(limit=2, order="asc")]
    assert every == [f"video_{i}" for i in range(1, 6)]
    lists = [r for r in mm.servicer.requests if isinstance(r, pb.ListVideosRequest)]
    assert [(r.after, r.limit, r.order) for r in lists] == [
        ("", 2, "asc"),
        ("", 2, "asc"),
        ("video_2", 2, "asc"),
        ("video_4", 2, "asc"),
    ]


async def test_download_content_delete_and_remix(sdk, mm):
    video = mm.servicer.add(model=VIDEO, status="completed", progress=100, completed_at=3)
    mp4 = bytes(range(256)) * 50 + b"end"
    mm.servicer.content[(video.id, pb.CONTENT_VARIANT_VIDEO)] = ("video/mp4", mp4)
    mm.servicer.content[(video.id, pb.CONTENT_VARIANT_THUMBNAIL)] = ("image/webp", b"RIFFwebp")
    assert (await sdk.videos.download_content(video.id)).content == mp4
    thumbnail = await sdk.videos.download_content(video.id, variant="thumbnail")
    assert thumbnail.content == b"RIFFwebp"
    assert thumbnail.response.headers["content-type"] == "image/webp"
    remix = await sdk.videos.remix(video.id, prompt="at dusk")
    assert (remix.remixed_from_video_id, remix.prompt, remix.status) == (
        video.id,
        "at dusk",
        "queued",
    )
    deleted = await sdk.videos.delete(video.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (video.id, True, "video.deleted")
    with pytest.raises(openai.NotFoundError):
        await sdk.videos.retrieve(video.id)


async def test_errors_become_the_sdks_exceptions(sdk, mm):
    queued = mm.servicer.add(model=VIDEO)
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.videos.download_content(queued.id)
    assert info.value.code == "video_not_ready"
    with pytest.raises(openai.NotFoundError) as info:
        await sdk.videos.create(prompt="x", model="sora-2")
    assert (info.value.code, info.value.param) == ("model_not_found", "model")
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.videos.create(prompt="x", extra_body={"fps": 0})
    assert info.value.param == "fps"
    mm.servicer.error = (grpc.StatusCode.RESOURCE_EXHAUSTED, "the render queue is full", None)
    mm.servicer.trailing_metadata = (("retry-after", "30"),)
    with pytest.raises(openai.RateLimitError) as info:
        await sdk.videos.create(prompt="x")
    assert info.value.response.headers["retry-after"] == "30"


async def test_models_list_the_video_model_with_its_card(sdk, mm):
    mm.servicer.cards = [pb.ModelCard(id=VIDEO, random_weights=True, description="noise")]
    models = {m.id: m for m in (await sdk.models.list()).data}
    assert list(models) == ["llm", VIDEO]
    assert models[VIDEO].model_extra == {"random_weights": True, "description": "noise"}
    assert "random_weights" not in models["llm"].model_extra
