"""``VideoJobs`` on a real redis-server and a local storage directory, without workers:
what the service writes, refuses and cleans up. (Rendering is tests/test_video_*.py.)"""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from jacana_jobs import JobStatus, LocalStorage, make_celery
from jacana_multimodal.artifacts import artifact_key, input_key
from jacana_multimodal.errors import InvalidVideoRequest, NotFound, NotReady, QueueFull
from jacana_multimodal.pipelines.cards import WAN21_I2V_TINY, WAN21_T2V_TINY
from jacana_multimodal.service import RENDER_QUEUE, CreateRequest, VideoJobs
from redis_server import RedisServer

T2V, I2V = "wan-tiny-random", "wan-tiny-i2v-random"


def make_jobs(redis_server: RedisServer, root: Path, **limits) -> VideoJobs:
    from dataclasses import replace

    celery = make_celery("test", redis_server.url, visibility_timeout_s=20, longest_task_s=10)
    options = {"ttl_s": 3600.0, "max_queued": 8, "retry_after_s": 7, **limits}
    return VideoJobs(
        redis_server.client(),
        LocalStorage(root / "files"),
        celery,
        [replace(WAN21_T2V_TINY, id=T2V), replace(WAN21_I2V_TINY, id=I2V)],
        **options,
    )


def png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), 200, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_create_writes_a_queued_record_and_enqueues_it(redis_server, tmp_path) -> None:
    jobs = make_jobs(redis_server, tmp_path)
    view = jobs.create(CreateRequest(model="", prompt="a heron", seed=5))
    assert view.record.status == JobStatus.QUEUED and view.record.model == T2V
    assert view.params.seed == 5 and "random weights" in view.notice
    assert redis_server.client().llen(RENDER_QUEUE) == 1
    assert jobs.get(view.record.id).record.id == view.record.id


def test_a_refused_create_leaves_nothing_behind(redis_server, tmp_path) -> None:
    jobs = make_jobs(redis_server, tmp_path)
    with pytest.raises(InvalidVideoRequest):
        jobs.create(CreateRequest(model=T2V, prompt="a heron", size="999x999"))
    with pytest.raises(InvalidVideoRequest) as exc:
        jobs.create(CreateRequest(model=I2V, prompt="a heron", input_reference=b"not an image"))
    assert exc.value.param == "input_reference"
    with pytest.raises(NotFound) as missing:
        jobs.create(CreateRequest(model="nope", prompt="a heron"))
    assert missing.value.param == "model"
    assert jobs.list("", 100, "desc") == ([], False)
    assert redis_server.client().llen(RENDER_QUEUE) == 0
    assert not (tmp_path / "files").exists()


def test_the_reference_image_is_stored_at_the_render_size_and_deleted_with_the_job(
    redis_server, tmp_path
) -> None:
    jobs = make_jobs(redis_server, tmp_path)
    view = jobs.create(
        CreateRequest(model=I2V, prompt="a heron", size="64x64", input_reference=png(300, 200))
    )
    stored = jobs.storage.path_for(input_key(view.record.id))
    assert Image.open(stored).size == (64, 64)
    jobs.delete(view.record.id)
    assert not stored.exists()
    with pytest.raises(NotFound):
        jobs.get(view.record.id)


def test_content_and_remix_need_a_completed_video(redis_server, tmp_path) -> None:
    jobs = make_jobs(redis_server, tmp_path)
    video_id = jobs.create(CreateRequest(model=T2V, prompt="a heron")).record.id
    with pytest.raises(NotReady) as exc:
        jobs.content(video_id, "video")
    assert exc.value.code == "video_not_ready"
    with pytest.raises(NotReady):
        jobs.remix(video_id, "a crane", None)
    with pytest.raises(InvalidVideoRequest):
        jobs.content(video_id, "poster")


def test_a_full_queue_refuses_with_retry_after(redis_server, tmp_path) -> None:
    jobs = make_jobs(redis_server, tmp_path, max_queued=2)
    for _ in range(2):
        jobs.create(CreateRequest(model=T2V, prompt="a heron"))
    with pytest.raises(QueueFull) as exc:
        jobs.create(CreateRequest(model=T2V, prompt="a heron"))
    assert exc.value.retry_after_s == 7
    assert len(jobs.list("", 100, "desc")[0]) == 2


def test_the_sweep_deletes_expired_videos_files(redis_server, tmp_path) -> None:
    jobs = make_jobs(redis_server, tmp_path, ttl_s=0.5)
    video_id = jobs.create(CreateRequest(model=T2V, prompt="a heron")).record.id
    jobs.store.start(video_id)
    keys = {v: artifact_key(video_id, v) for v in ("video", "thumbnail", "spritesheet")}
    for key in keys.values():
        with jobs.storage.writer(key) as f:
            f.write(b"x")
    jobs.store.complete(video_id, keys)
    assert jobs.content(video_id, "video")[1] == 1
    time.sleep(0.6)
    with pytest.raises(NotFound):
        jobs.get(video_id)  # Redis expired the record
    assert all(jobs.storage.exists(k) for k in keys.values())  # the files wait for the sweep
    assert jobs.sweep() == 1
    assert not any(jobs.storage.exists(k) for k in keys.values())
    assert jobs.sweep() == 0
