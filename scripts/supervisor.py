"""Child-process supervision for ``make up`` (``scripts/stack.py``): start services in
order, wait for each one's health probe, echo and log their output, and stop them all
(in reverse order, SIGTERM then SIGKILL) on Ctrl-C, SIGTERM, or when one of them dies.

Each child runs in its own session, so a Ctrl-C in the terminal reaches only the
supervisor, which then stops them in order; a child that dies takes the others down and
the supervisor exits non-zero, showing the last lines the child wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import urllib.request
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROGRESS_EVERY_S = 5.0
TAIL_LINES = 40


Probe = Callable[[], Awaitable[bool]]


def say(message: str) -> None:
    print(f"[stack] {message}", flush=True)


@dataclass
class Service:
    """One child process: how to start it and how to tell that it is ready."""

    name: str
    argv: Sequence[str]
    env: dict[str, str]
    probe: Probe
    log_path: Path | None = None
    process: asyncio.subprocess.Process | None = None
    ready: bool = False
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    _pump: asyncio.Task | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        self._pump = asyncio.create_task(self._copy_output())

    async def _copy_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        log = self.log_path.open("w", encoding="utf-8") if self.log_path else None
        try:
            while line := await self.process.stdout.readline():
                text = line.decode(errors="replace").rstrip("\n")
                self.tail.append(text)
                print(f"[{self.name}] {text}", flush=True)
                if log:
                    log.write(text + "\n")
                    log.flush()
        finally:
            if log:
                log.close()

    @property
    def exited(self) -> bool:
        return self.process is not None and self.process.returncode is not None

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            _signal_group(self.process.pid, signal.SIGKILL)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM the child's process group; SIGKILL it if still alive after ``grace_s``."""
        proc = self.process
        if proc is None:
            return
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                say(f"{self.name} did not stop within {grace_s:.0f}s; killing it")
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        # Reap anything the child left behind in its group.
        _signal_group(proc.pid, signal.SIGKILL)
        if self._pump:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._pump, 5.0)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def supervise(
    services: Sequence[Service],
    *,
    start_timeout_s: float,
    grace_s: float,
    on_ready: Callable[[], None] = lambda: None,
    stop: asyncio.Event | None = None,
) -> int:
    """Start ``services`` in order, wait until all are ready, run until stopped or one dies.

    Returns 0 after a requested stop, 1 when a child died or start-up timed out.
    Children are always stopped, in reverse order, before this returns.
    """
    stop = stop or asyncio.Event()
    started: list[Service] = []

    def on_signal() -> None:
        if stop.is_set():  # a second Ctrl-C: do not wait for the graceful path
            say("interrupted again; killing")
            for service in started:
                service.kill()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    try:
        for service in services:
            await service.start()
            started.append(service)
            assert service.process is not None
            say(f"started {service.name} (pid {service.process.pid}): {' '.join(service.argv)}")
        return await _watch(services, start_timeout_s, on_ready, stop)
    finally:
        if started:
            say("stopping " + ", ".join(s.name for s in reversed(started)))
        for service in reversed(started):
            await service.stop(grace_s)
        if started:
            say("stopped")
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


async def _watch(
    services: Sequence[Service],
    start_timeout_s: float,
    on_ready: Callable[[], None],
    stop: asyncio.Event,
) -> int:
    begun = time.monotonic()
    last_progress = begun
    all_ready = False
    while not stop.is_set():
        for service in services:
            if service.exited:
                assert service.process is not None
                await asyncio.sleep(0.2)  # let the output pump catch the last lines
                code = service.process.returncode
                say(f"{service.name} exited with code {code}; its last lines:")
                for line in service.tail:
                    print(f"    {line}", flush=True)
                return 1
        if not all_ready:
            # In order: a service is asked only once those before it are ready (the gateway
            # reports healthy only with a serving engine behind it).
            for service in services:
                if not service.ready:
                    if not await service.probe():
                        break
                    service.ready = True
                    say(f"{service.name} is ready ({time.monotonic() - begun:.1f}s)")
            all_ready = all(s.ready for s in services)
            if all_ready:
                on_ready()
                continue
            elapsed = time.monotonic() - begun
            if elapsed > start_timeout_s:
                waiting = ", ".join(s.name for s in services if not s.ready)
                say(f"{waiting} not ready after {start_timeout_s:.0f}s; giving up")
                return 1
            if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                last_progress = time.monotonic()
                waiting = ", ".join(s.name for s in services if not s.ready)
                say(f"waiting for {waiting} … {elapsed:.0f}s")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return 0


def grpc_probe(target: str) -> Probe:
    async def probe() -> bool:
        from jacana_common.grpc_client import check_health

        try:
            return await check_health(target, timeout=1.0)
        except Exception:
            return False

    return probe


def http_probe(url: str) -> Probe:
    def get() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2.0) as resp:
                return resp.status == 200
        except Exception:
            return False

    async def probe() -> bool:
        return await asyncio.to_thread(get)

    return probe
