"""Fixtures of the drafter tests: a real ``python -m jacana_drafter`` process on a free
loopback port that a test can kill and restart."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stack import free_port


def wait_serving(address: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"drafter at {address} did not come up")


class DrafterProcess:
    """The drafter service as a child process on a fixed port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, JACANA_DRAFTER_PORT=str(self.port), JACANA_DRAFTER_HOST="127.0.0.1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jacana_drafter"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wait_serving(self.address)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def drafter():
    process = DrafterProcess(free_port())
    process.start()
    yield process
    process.kill()
