"""A job service as real processes, for tests: a redis-server, one gRPC service that
accepts jobs (the multimodal or the asr service), its Celery workers and a gateway that
serves only that service's models.

Subclasses name the service (module, settings prefix, worker app and queue, the gateway's
model map) and what the service and its workers share in ``env``. Each part can be stopped,
killed and started again on the same ports and data, which is what the durability tests
do; workers run in their own process group (:func:`stack.start_worker`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Self

import httpx

from redis_server import RedisServer
from stack import Service, Worker, free_port, grpc_ready, http_ready, start_service, start_worker


@dataclass
class JobStack:
    root: Path
    redis: RedisServer
    extra_env: dict[str, str] = field(default_factory=dict)
    service: Service | None = None
    gateway: Service | None = None
    workers: list[Worker] = field(default_factory=list)
    service_port: int = field(default_factory=free_port)
    gateway_port: int = field(default_factory=free_port)

    module: ClassVar[str]  # python -m <module>
    prefix: ClassVar[str]  # its settings' prefix, "JACANA_ASR_"
    worker_app: ClassVar[str]  # celery -A <worker_app>
    queue: ClassVar[str]
    gateway_map: ClassVar[str]  # the gateway's model map for it, "ASR"
    gateway_env: ClassVar[dict[str, str]] = {}

    @property
    def env(self) -> dict[str, str]:
        """What the service and its workers share."""
        raise NotImplementedError

    @property
    def models(self) -> list[str]:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}/v1"

    def start_service(self) -> Service:
        self.service = start_service(
            self.module,
            {
                **self.env,
                f"{self.prefix}HOST": "127.0.0.1",
                f"{self.prefix}PORT": str(self.service_port),
            },
            f"127.0.0.1:{self.service_port}",
            grpc_ready,
        )
        return self.service

    def start_gateway(self) -> Service:
        target = [f"127.0.0.1:{self.service_port}"]
        self.gateway = start_service(
            "jacana_gateway",
            {
                "JACANA_GATEWAY_HOST": "127.0.0.1",
                "JACANA_GATEWAY_PORT": str(self.gateway_port),
                f"JACANA_GATEWAY_{self.gateway_map}": json.dumps(
                    {model: target for model in self.models}
                ),
                **self.gateway_env,
            },
            f"127.0.0.1:{self.gateway_port}",
            http_ready,
        )
        return self.gateway

    def start_worker(self, name: str | None = None) -> Worker:
        name = name or f"w{len(self.workers) + 1}"
        worker = start_worker(self.worker_app, self.queue, name, self.env)
        self.workers.append(worker)
        return worker

    def http(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=timeout)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        for service in (self.gateway, self.service):
            if service is not None:
                service.stop()
        self.redis.stop()

    @classmethod
    def start(cls, root: Path, workers: int = 1, **extra_env: str) -> Self:
        """Redis, the service, ``workers`` workers and a gateway; all stopped again if
        one of them fails to start."""
        redis = RedisServer(root / "redis")
        redis.start()
        stack = cls(root, redis, extra_env)
        try:
            stack.start_service()
            for _ in range(workers):
                stack.start_worker()
            stack.start_gateway()
        except BaseException:
            stack.stop()
            raise
        return stack
