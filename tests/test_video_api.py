"""The Videos API end to end through the official SDK: gateway -> multimodal service ->
Redis -> a real Celery render worker running the real tiny Wan pipeline on CPU.

One stack for the module; each test makes its own videos."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import av
import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from video_stack import VIDEO_MODEL, VideoStack, start_video_stack, wait_for

SIZE = "128x128"
I2V_MODEL = "wan-tiny-i2v-random"
MODELS = [
    {"id": VIDEO_MODEL, "architecture": "wan2.1-t2v-tiny"},
    {"id": I2V_MODEL, "architecture": "wan2.1-i2v-tiny"},
]
# The SDK marks its Videos methods deprecated; they are what clients call all the same.
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VideoStack]:
    running = start_video_stack(
        tmp_path_factory.mktemp("video-api"), JACANA_MULTIMODAL_MODELS=json.dumps(MODELS)
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def client(stack: VideoStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)


def long_render(client: openai.OpenAI, **extra) -> str:
    """A render that takes seconds on this CPU: many steps at the largest frame count."""
    video = client.videos.create(
        prompt="a heron walks through the reeds",
        model=VIDEO_MODEL,
        seconds="4",
        size=SIZE,
        extra_body={"num_inference_steps": 100, "fps": 12, **extra},
    )
    return video.id


def test_create_and_poll_then_download_every_variant(client: openai.OpenAI) -> None:
    video = client.videos.create_and_poll(
        prompt="a red fox runs across a snowy field", model=VIDEO_MODEL, seconds="2", size=SIZE
    )
    assert video.status == "completed", video.error
    assert video.progress == 100
    assert video.model == VIDEO_MODEL and video.seconds == "2" and video.size == SIZE
    assert video.completed_at is not None and video.expires_at > video.created_at
    assert "random weights" in video.model_extra["notice"]
    fps = video.model_extra["fps"]

    mp4 = client.videos.download_content(video.id).read()
    with av.open(io.BytesIO(mp4)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        duration = float(stream.duration * stream.time_base) if stream.duration else None
    assert len(frames) == 2 * fps
    assert frames[0].shape == (128, 128, 3)
    if duration is not None:
        assert abs(duration - 2.0) <= 1.0 / fps

    thumbnail = Image.open(
        io.BytesIO(client.videos.download_content(video.id, variant="thumbnail").read())
    )
    assert thumbnail.format == "WEBP" and thumbnail.size == (128, 128)
    sheet = Image.open(
        io.BytesIO(client.videos.download_content(video.id, variant="spritesheet").read())
    )
    assert sheet.format == "JPEG" and sheet.width % 128 == 0 and sheet.height % 128 == 0


def test_the_same_seed_renders_the_same_video(client: openai.OpenAI) -> None:
    first, second = (
        client.videos.create_and_poll(
            prompt="waves on a pebble beach",
            model=VIDEO_MODEL,
            seconds="1",
            size=SIZE,
            extra_body={"seed": 1234},
        )
        for _ in range(2)
    )
    assert first.model_extra["seed"] == second.model_extra["seed"] == 1234
    a = client.videos.download_content(first.id, variant="thumbnail").read()
    b = client.videos.download_content(second.id, variant="thumbnail").read()
    assert a == b
    other = client.videos.create_and_poll(
        prompt="waves on a pebble beach", model=VIDEO_MODEL, seconds="1", size=SIZE,
        extra_body={"seed": 99},
    )  # fmt: skip
    assert client.videos.download_content(other.id, variant="thumbnail").read() != a


def test_progress_rises_while_rendering(client: openai.OpenAI) -> None:
    video_id = long_render(client)
    seen = []
    video = wait_for(
        client, video_id, lambda v: seen.append(v.progress) or v.status == "completed", 120
    )
    assert video.progress == 100
    assert seen == sorted(seen)
    assert any(0 < p < 100 for p in seen), seen


def test_list_pages_in_both_orders(client: openai.OpenAI) -> None:
    ids = [
        client.videos.create(prompt=f"clip {i}", model=VIDEO_MODEL, seconds="1", size=SIZE).id
        for i in range(3)
    ]
    newest = client.videos.list(limit=2)
    assert [v.id for v in newest.data] == ids[::-1][:2]
    assert newest.has_more
    rest = client.videos.list(limit=2, after=newest.data[-1].id)
    assert rest.data[0].id == ids[0]
    oldest_first = [v.id for v in client.videos.list(order="asc", limit=100).data]
    assert oldest_first.index(ids[0]) < oldest_first.index(ids[1]) < oldest_first.index(ids[2])
    for video_id in ids:
        wait_for(client, video_id, lambda v: v.status == "completed")


def test_deleting_a_running_render_frees_the_worker_within_a_step(
    client: openai.OpenAI, stack: VideoStack
) -> None:
    # At 30 fps the render has seconds of denoising and decoding left after its first step.
    video_id = long_render(client, fps=30)
    wait_for(client, video_id, lambda v: v.status == "in_progress" and v.progress > 0)
    deleted = client.videos.delete(video_id)
    started = time.monotonic()
    assert deleted.id == video_id and deleted.deleted and deleted.object == "video.deleted"
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video_id)
    worker = stack.workers[0]
    while f"{video_id}: cancelled" not in worker.log_text():
        assert time.monotonic() - started < 3.0, worker.log_text()[-2000:]
        time.sleep(0.02)
    quick = client.videos.create_and_poll(
        prompt="a leaf falls", model=VIDEO_MODEL, seconds="1", size=SIZE
    )
    assert quick.status == "completed"
    files = Path(stack.env["JACANA_MULTIMODAL_STORAGE_DIR"])
    assert not list(files.rglob(f"*{video_id}*"))


def test_remix_renders_the_same_request_under_a_new_prompt(client: openai.OpenAI) -> None:
    source = client.videos.create_and_poll(
        prompt="a kite over a hill", model=VIDEO_MODEL, seconds="1", size=SIZE,
        extra_body={"seed": 7},
    )  # fmt: skip
    remix = client.videos.remix(source.id, prompt="a kite over the sea")
    assert remix.remixed_from_video_id == source.id and remix.prompt == "a kite over the sea"
    done = wait_for(client, remix.id, lambda v: v.status == "completed")
    assert done.model_extra["seed"] == 7 and done.size == source.size


def test_an_image_to_video_model_starts_from_the_uploaded_image(client: openai.OpenAI) -> None:
    image = io.BytesIO()
    Image.fromarray(np.full((90, 160, 3), (200, 40, 40), np.uint8)).save(image, format="PNG")
    video = client.videos.create_and_poll(
        prompt="the red wall", model=I2V_MODEL, seconds="1", size="160x96",
        input_reference=("wall.png", image.getvalue(), "image/png"),
    )  # fmt: skip
    assert video.status == "completed", video.error
    assert video.size == "160x96"
    remix = client.videos.remix(video.id, prompt="the red wall at night")
    assert wait_for(client, remix.id, lambda v: v.status == "completed").size == "160x96"


# -- bad input -------------------------------------------------------------------------


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x" * 100_000}, "prompt"),
        ({"seconds": "9"}, "seconds"),
        ({"seconds": "four"}, "seconds"),
        ({"size": "999x999"}, "size"),
        ({"num_inference_steps": "0"}, "num_inference_steps"),
        ({"guidance_scale": "nan"}, "guidance_scale"),
    ],
)
def test_bad_fields_are_400_naming_the_field(stack: VideoStack, fields, param) -> None:
    form = {"prompt": "a cat", "model": VIDEO_MODEL, **fields}
    with stack.http(30) as http:
        response = http.post("/videos", data=form, files={"unused": ("", b"")})
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == param


def test_a_non_image_reference_is_400_naming_input_reference(stack: VideoStack) -> None:
    with stack.http(30) as http:
        response = http.post(
            "/videos",
            data={"prompt": "a cat", "model": VIDEO_MODEL},
            files={"input_reference": ("cat.png", b"this is not an image", "image/png")},
        )
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == "input_reference"


def test_unknown_model_and_unknown_id_are_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.videos.create(prompt="a cat", model="no-such-model")
    assert exc.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve("video_" + "0" * 32)
    with pytest.raises(openai.NotFoundError):
        client.videos.download_content("video_" + "0" * 32)


def test_content_of_an_unfinished_video_says_it_is_not_ready(client: openai.OpenAI) -> None:
    video_id = long_render(client)
    with pytest.raises(openai.BadRequestError) as exc:
        client.videos.download_content(video_id)
    assert exc.value.body["code"] == "video_not_ready"
    client.videos.delete(video_id)


def test_models_label_the_tiny_default_as_random(stack: VideoStack) -> None:
    with stack.http(30) as http:
        models = http.get("/models").json()["data"]
    card = next(m for m in models if m["id"] == VIDEO_MODEL)
    assert card["random_weights"] is True
    assert "noise" in card["description"]


def test_reference_frames_match_the_bare_pipeline(client: openai.OpenAI, stack: VideoStack) -> None:
    """The worker renders what a plain diffusers call on the same weights renders: the
    MP4's first frame against the pipeline's, within H.264's loss."""
    import torch
    from diffusers import WanPipeline

    from jacana_multimodal.pipelines.tiny_wan import ensure_tiny_wan

    video = client.videos.create_and_poll(
        prompt="a lighthouse at dusk", model=VIDEO_MODEL, seconds="1", size=SIZE,
        extra_body={"seed": 5},
    )  # fmt: skip
    params = video.model_extra
    pipe = WanPipeline.from_pretrained(
        ensure_tiny_wan(Path(stack.env["JACANA_MULTIMODAL_CACHE_DIR"]))
    )
    frames = pipe(
        prompt="a lighthouse at dusk", negative_prompt=params["negative_prompt"],
        height=128, width=128, num_frames=4 * -(-(params["fps"] - 1) // 4) + 1,
        num_inference_steps=params["num_inference_steps"],
        guidance_scale=params["guidance_scale"],
        generator=torch.Generator().manual_seed(5), output_type="np",
    ).frames[0]  # fmt: skip
    expected = np.round(frames[0] * 255).astype(np.int16)
    mp4 = client.videos.download_content(video.id).read()
    with av.open(io.BytesIO(mp4)) as container:
        first = next(container.decode(video=0)).to_ndarray(format="rgb24").astype(np.int16)
    assert np.abs(first - expected).mean() < 6.0
