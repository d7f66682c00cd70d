"""The video half of the stack as real processes, for tests: a redis-server, the
multimodal service, Celery render workers and a gateway serving only the video model.

Each part can be stopped, killed and started again on the same ports and data, which is
what the durability tests do. Workers run in their own process group, so killing one
takes its pool child with it (:func:`stack.start_worker`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import ClassVar

from job_stack import JobStack

VIDEO_MODEL = "wan-tiny-random"


class VideoStack(JobStack):
    """Redis, the multimodal service, render workers and a gateway."""

    module = "jacana_multimodal"
    prefix = "JACANA_MULTIMODAL_"
    worker_app = "jacana_multimodal.worker"
    queue = "jacana.video"
    gateway_map = "VIDEOS"
    gateway_env: ClassVar[dict[str, str]] = {"JACANA_GATEWAY_VIDEO_POLL_AFTER_MS": "100"}

    @property
    def env(self) -> dict[str, str]:
        return {
            "JACANA_MULTIMODAL_REDIS_URL": self.redis.url,
            "JACANA_MULTIMODAL_STORAGE_DIR": str(self.root / "videos"),
            "JACANA_MULTIMODAL_CACHE_DIR": str(self.root / "cache"),
            "JACANA_MULTIMODAL_DEVICE": "cpu",
            # A dead worker's render is handed on within seconds, not hours.
            "JACANA_MULTIMODAL_LONGEST_JOB_S": "20",
            "JACANA_MULTIMODAL_VISIBILITY_TIMEOUT_S": "25",
            "JACANA_MULTIMODAL_RESTORE_INTERVAL_S": "1",
            "OMP_NUM_THREADS": "1",
            **self.extra_env,
        }

    @property
    def models(self) -> list[str]:
        """The video model ids the service is configured with (the tiny default alone
        unless ``JACANA_MULTIMODAL_MODELS`` says otherwise)."""
        raw = self.extra_env.get("JACANA_MULTIMODAL_MODELS")
        return [spec["id"] for spec in json.loads(raw)] if raw else [VIDEO_MODEL]


def start_video_stack(root: Path, workers: int = 1, **extra_env: str) -> VideoStack:
    """Redis, the multimodal service, ``workers`` render workers and a gateway."""
    return VideoStack.start(root, workers, **extra_env)


def wait_for(client, video_id: str, predicate, timeout_s: float = 90.0):
    """Poll ``client.videos.retrieve(video_id)`` until ``predicate(video)``; fail with the
    video's last status after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        video = client.videos.retrieve(video_id)
        if predicate(video):
            return video
        assert time.monotonic() < deadline, f"{video_id} stuck at {video.status} {video.progress}%"
        time.sleep(0.05)
