"""A real ``redis-server`` for tests: loopback, a free port, append-only persistence.

Also a pytest plugin (the root conftest loads it): the ``redis_server`` fixture gives each
test its own server, data under its ``tmp_path``.

Stopped with SIGTERM, so Redis flushes its append-only file and a restart on the same
``data_dir`` finds every acknowledged write.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from stack import free_port


class RedisServer:
    """One ``redis-server`` on 127.0.0.1 with append-only persistence in ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def start(self) -> None:
        """Start on the port of the previous start (a restart), else on a free one."""
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed (scripts/bootstrap.sh installs it)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fixed = self.port  # a restart keeps its port (and its data)
        for _ in range(1 if fixed else 5):  # a free port can be taken before we bind it
            self.port = fixed or free_port()
            self.proc = subprocess.Popen(
                [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                 str(self.data_dir), "--appendonly", "yes", "--appendfsync", "always",
                 "--save", "", "--protected-mode", "no", "--loglevel", "warning"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            deadline = time.monotonic() + 10
            while self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    if self.client().ping():
                        return
                except redis.ConnectionError:
                    time.sleep(0.02)
            self.stop()
        pytest.fail("redis-server did not start")

    def stop(self) -> None:
        """SIGTERM (Redis flushes its append-only file), then wait for the exit."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A started ``RedisServer`` for one test; stopped after it."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()
