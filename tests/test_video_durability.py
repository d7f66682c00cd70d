"""No accepted video is lost: a render worker SIGKILLed mid-render, Redis killed and
restarted, the gateway and the multimodal service restarted. Real processes throughout:
redis-server with append-only persistence, Celery workers, the tiny Wan pipeline."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from video_stack import VIDEO_MODEL, VideoStack, start_video_stack, wait_for

SIZE = "128x128"
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")


@pytest.fixture
def stack(tmp_path) -> Iterator[VideoStack]:
    running = start_video_stack(
        tmp_path,
        workers=0,
        # Short enough that a dead worker's render moves on within seconds; longer than
        # any render here.
        JACANA_MULTIMODAL_LONGEST_JOB_S="8",
        JACANA_MULTIMODAL_VISIBILITY_TIMEOUT_S="10",
    )
    try:
        yield running
    finally:
        running.stop()


def client_for(stack: VideoStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)


def test_a_render_whose_worker_is_killed_completes_on_another(stack: VideoStack) -> None:
    client = client_for(stack)
    first = stack.start_worker("first")
    video = client.videos.create(
        prompt="a heron takes off", model=VIDEO_MODEL, seconds="4", size=SIZE,
        extra_body={"num_inference_steps": 100, "fps": 8},
    )  # fmt: skip
    wait_for(client, video.id, lambda v: v.status == "in_progress" and v.progress > 0)
    first.kill()
    second = stack.start_worker("second")
    done = wait_for(client, video.id, lambda v: v.status == "completed", 120)
    assert done.progress == 100
    assert video.id in second.log_text()
    assert len(client.videos.download_content(done.id).read()) > 0


def test_redis_killed_and_restarted_loses_no_accepted_video(stack: VideoStack) -> None:
    client = client_for(stack)
    ids = [
        client.videos.create(prompt=f"clip {i}", model=VIDEO_MODEL, seconds="1", size=SIZE).id
        for i in range(3)
    ]  # no worker yet: all three wait in the queue
    stack.redis.proc.kill()  # no chance to flush: only the append-only file remains
    stack.redis.proc.wait(10)
    stack.redis.proc = None
    with pytest.raises(openai.APIStatusError) as exc:
        client.videos.retrieve(ids[0])
    assert exc.value.status_code == 503
    stack.redis.start()
    assert [client.videos.retrieve(i).status for i in ids] == ["queued"] * 3
    stack.start_worker()
    for video_id in ids:
        assert wait_for(client, video_id, lambda v: v.status == "completed").progress == 100


def test_every_video_survives_a_gateway_and_service_restart(stack: VideoStack) -> None:
    client = client_for(stack)
    stack.start_worker()
    done = client.videos.create_and_poll(
        prompt="rain on a window", model=VIDEO_MODEL, seconds="1", size=SIZE
    )
    queued = client.videos.create(
        prompt="a train in the night", model=VIDEO_MODEL, seconds="1", size=SIZE
    )
    before = client.videos.download_content(done.id).read()
    stack.gateway.stop()
    stack.service.stop()
    stack.start_service()
    stack.start_gateway()
    client = client_for(stack)
    assert client.videos.retrieve(done.id).status == "completed"
    assert client.videos.download_content(done.id).read() == before
    assert wait_for(client, queued.id, lambda v: v.status == "completed").progress == 100
    listed = {v.id for v in client.videos.list(limit=100).data}
    assert {done.id, queued.id} <= listed


def test_a_full_queue_is_429_with_retry_after(tmp_path) -> None:
    stack = start_video_stack(tmp_path, workers=0, JACANA_MULTIMODAL_MAX_QUEUED_JOBS="2")
    try:
        client = client_for(stack)
        accepted = [
            client.videos.create(prompt="a cat", model=VIDEO_MODEL, seconds="1", size=SIZE).id
            for _ in range(2)
        ]
        with pytest.raises(openai.RateLimitError) as exc:
            client.videos.create(prompt="a cat", model=VIDEO_MODEL, seconds="1", size=SIZE)
        assert int(exc.value.response.headers["retry-after"]) >= 1
        assert [client.videos.retrieve(i).status for i in accepted] == ["queued"] * 2
    finally:
        stack.stop()
