"""The video half of the stack as real processes, for tests: a redis-server, the
multimodal service, Celery render workers and a gateway serving only the video model.

Each part can be stopped, killed and started again on the same ports and data, which is
what the durability tests do. Workers run in their own process group, so killing one
takes its pool child with it (:func:`stack.start_worker`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from redis_server import RedisServer
from stack import Service, Worker, free_port, grpc_ready, http_ready, start_service, start_worker

VIDEO_MODEL = "wan-tiny-random"


@dataclass
class VideoStack:
    root: Path
    redis: RedisServer
    extra_env: dict[str, str] = field(default_factory=dict)
    multimodal: Service | None = None
    gateway: Service | None = None
    workers: list[Worker] = field(default_factory=list)
    multimodal_port: int = field(default_factory=free_port)
    gateway_port: int = field(default_factory=free_port)

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

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}/v1"

    def start_multimodal(self) -> Service:
        self.multimodal = start_service(
            "jacana_multimodal",
            {
                **self.env,
                "JACANA_MULTIMODAL_HOST": "127.0.0.1",
                "JACANA_MULTIMODAL_PORT": str(self.multimodal_port),
            },
            f"127.0.0.1:{self.multimodal_port}",
            grpc_ready,
        )
        return self.multimodal

    def start_gateway(self) -> Service:
        self.gateway = start_service(
            "jacana_gateway",
            {
                "JACANA_GATEWAY_HOST": "127.0.0.1",
                "JACANA_GATEWAY_PORT": str(self.gateway_port),
                "JACANA_GATEWAY_VIDEOS": json.dumps(
                    {model: [f"127.0.0.1:{self.multimodal_port}"] for model in self.models}
                ),
                "JACANA_GATEWAY_VIDEO_POLL_AFTER_MS": "100",
            },
            f"127.0.0.1:{self.gateway_port}",
            http_ready,
        )
        return self.gateway

    def start_worker(self, name: str | None = None) -> Worker:
        name = name or f"w{len(self.workers) + 1}"
        worker = start_worker("jacana_multimodal.worker", "jacana.video", name, self.env)
        self.workers.append(worker)
        return worker

    def gateway_http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        for service in (self.gateway, self.multimodal):
            if service is not None:
                service.stop()
        self.redis.stop()


def start_video_stack(root: Path, workers: int = 1, **extra_env: str) -> VideoStack:
    """Redis, the multimodal service, ``workers`` render workers and a gateway."""
    redis = RedisServer(root / "redis")
    redis.start()
    stack = VideoStack(root, redis, extra_env)
    try:
        stack.start_multimodal()
        for _ in range(workers):
            stack.start_worker()
        stack.start_gateway()
    except BaseException:
        stack.stop()
        raise
    return stack


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
