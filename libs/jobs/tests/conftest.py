"""Fixtures: a real ``redis-server`` per test (persistence on, data under tmp_path) and
a polling helper. Every process started here is stopped in a finalizer."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from redis_server import RedisServer


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


@pytest.fixture(scope="session")
def make_redis_server() -> type[RedisServer]:
    """The ``RedisServer`` class, for fixtures that need a server of a wider scope."""
    return RedisServer


@pytest.fixture(scope="session")
def poll() -> Callable[..., object]:
    """``wait_until(predicate, timeout_s, what)``: poll with a deadline, never a fixed sleep."""
    return wait_until
