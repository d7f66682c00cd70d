"""Start the real services as processes on free loopback ports, for tests.

Services are torn down with SIGTERM (the graceful path), escalating to SIGKILL only if
they hang. Celery workers (:func:`start_worker`) run in their own process group, so
killing one takes its pool child with it (:meth:`Worker.kill`: a machine that died).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from jacana_common.grpc_client import check_health

MODEL_ID = "smollm2-135m-instruct"
START_TIMEOUT_S = 180
WORKER_READY_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Service:
    """A started service process and where it listens."""

    process: subprocess.Popen
    address: str
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_service(module: str, env: dict[str, str], address: str, ready) -> Service:
    """Run ``python -m module`` with ``env``; wait until ``ready(address)`` is true."""
    log_path = Path(tempfile.mkstemp(prefix=f"{module}-", suffix=".log")[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", module],
        env={**os.environ, **env},
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
    )
    service = Service(proc, address, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{module} exited with {proc.returncode}:\n{service.log_tail()}")
        if ready(address):
            return service
        time.sleep(0.25)
    service.stop()
    raise RuntimeError(f"{module} not ready after {START_TIMEOUT_S}s:\n{service.log_tail()}")


def grpc_ready(address: str) -> bool:
    return asyncio.run(check_health(address, timeout=1.0))


def http_ready(address: str) -> bool:
    """The gateway answers /health and reports every model healthy."""
    try:
        return httpx.get(f"http://{address}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def http_answering(address: str) -> bool:
    """The gateway answers /health at all (some backends may be down)."""
    try:
        return httpx.get(f"http://{address}/health", timeout=1.0).status_code in (200, 503)
    except httpx.HTTPError:
        return False


def start_grpc_service(module: str, prefix: str, **env: str) -> Service:
    """``python -m module`` on a free loopback port, told through its ``{prefix}HOST`` /
    ``{prefix}PORT`` settings (e.g. ``JACANA_ASR_``); waits for gRPC health SERVING."""
    port = free_port()
    return start_service(
        module,
        {f"{prefix}HOST": "127.0.0.1", f"{prefix}PORT": str(port), **env},
        f"127.0.0.1:{port}",
        grpc_ready,
    )


def start_service_gateway(kind: str, models: dict[str, list[str]], **env: str) -> Service:
    """A gateway serving only ``models`` (model -> endpoints) through its
    ``JACANA_GATEWAY_{kind}`` map (``EMBEDDINGS``, ``ASR``), with no engines, so no LLM is
    loaded; waits for /health 200 (every model's service serving)."""
    port = free_port()
    return start_service(
        "jacana_gateway",
        {
            "JACANA_GATEWAY_HOST": "127.0.0.1",
            "JACANA_GATEWAY_PORT": str(port),
            f"JACANA_GATEWAY_{kind}": json.dumps(models),
            **env,
        },
        f"127.0.0.1:{port}",
        http_ready,
    )


def start_engine(**env: str) -> Service:
    return start_grpc_service("jacana_engine", "JACANA_ENGINE_", **env)


def start_gateway(engines: dict[str, list[str]], healthy: bool = True, **env: str) -> Service:
    """Start a gateway; wait until all its engines are healthy (or, if not ``healthy``,
    until it answers at all)."""
    port = free_port()
    return start_service(
        "jacana_gateway",
        {
            "JACANA_GATEWAY_HOST": "127.0.0.1",
            "JACANA_GATEWAY_PORT": str(port),
            "JACANA_GATEWAY_ENGINES": json.dumps(engines),
            **env,
        },
        f"127.0.0.1:{port}",
        http_ready if healthy else http_answering,
    )


@dataclass
class Worker:
    """One ``celery worker`` process group and its log."""

    name: str
    process: subprocess.Popen
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the worker and its pool child at once: a machine that died."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


def start_worker(app: str, queue: str, name: str, env: dict[str, str]) -> Worker:
    """``celery -A app worker -Q queue`` (prefork, concurrency 1) named ``name@host``,
    with ``env`` over this process's environment; returns once it is ready."""
    log_path = Path(tempfile.mkstemp(prefix=f"celery-{name}-", suffix=".log")[1])
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", app, "worker",
         "-Q", queue, "--concurrency", "1", "--pool", "prefork",
         "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
         "--without-heartbeat", "--loglevel", "INFO"],
        env={**os.environ, **env},
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    worker = Worker(name, process, log_path)
    deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
    while " ready." not in worker.log_text():
        if process.poll() is not None or time.monotonic() > deadline:
            worker.stop()
            raise RuntimeError(f"celery worker {name} did not start:\n{worker.log_text()}")
        time.sleep(0.1)
    return worker
