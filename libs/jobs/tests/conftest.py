"""Fixtures: a real ``redis-server`` per test (persistence on, data under tmp_path) and
a polling helper. Every process started here is stopped in a finalizer."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from stack import free_port


def wait_until(predicate: Callable[[], object], timeout_s: float = 10.0, what: str = "") -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(0.02)


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
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed (scripts/bootstrap.sh installs it)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(5):  # a free port can be taken between probing and binding
            self.port = free_port()
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
    server = RedisServer(tmp_path / "redis")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def make_redis_server() -> type[RedisServer]:
    """The ``RedisServer`` class, for fixtures that need a server of a wider scope."""
    return RedisServer


@pytest.fixture(scope="session")
def poll() -> Callable[..., object]:
    """``wait_until(predicate, timeout_s, what)``: poll with a deadline, never a fixed sleep."""
    return wait_until
