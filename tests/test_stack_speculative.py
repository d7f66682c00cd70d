"""`make up` with speculative decoding turned on by its one setting: the real supervisor
(scripts/stack.py) starts the drafter, the engine (pointed at the drafter) and the gateway;
a greedy request through the gateway returns what the session's speculation-free stack
returns, the engine's stats count the drafter's accepted drafts, an opted-out request
drafts nothing, and a drafter that dies takes the stack down like any other service."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jacana_common.grpc_client import make_channel
from jacana_common.pb.jacana.engine.v1 import engine_pb2, engine_pb2_grpc
from stack import MODEL_ID, free_port

STACK_PY = Path(__file__).resolve().parents[1] / "scripts" / "stack.py"
START_TIMEOUT_S = 240
# The model copies the list, so prompt lookup finds every continuation in the prompt.
MESSAGES = [
    {
        "role": "user",
        "content": "Repeat this list exactly: red, green, blue, yellow, orange, purple, "
        "black, white, red, green, blue, yellow, orange, purple, black, white.",
    }
]
MAX_TOKENS = 32


@dataclass
class RunningStack:
    """``scripts/stack.py`` as a child process, its output collected line by line."""

    process: subprocess.Popen
    engine: str
    drafter_port: int
    base_url: str
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def _collect(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            reading = self._reader is not None and self._reader.is_alive()
            if self.process.poll() is not None and not reading:
                break
            time.sleep(0.2)
        tail = "\n".join(self.lines[-40:])
        raise AssertionError(f"no line matching {pattern!r} in the stack's output:\n{tail}")

    def pid_of(self, service: str) -> int:
        return int(self.wait_for(rf"\[stack\] started {service} \(pid (\d+)\)", 5).group(1))

    def start_reading(self) -> None:
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()


@pytest.fixture(scope="module")
def spec_stack(tmp_path_factory) -> Iterator[RunningStack]:
    engine_port, drafter_port, gateway_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "JACANA_ENGINE_SPECULATIVE_PROPOSER": "ngram",  # the one setting
        # and drafting at every step (no timing-driven pause): deterministic counters
        "JACANA_ENGINE_SPECULATIVE_DYNAMIC_K": "false",
        "JACANA_STACK_EMBEDDINGS": "0",
        "JACANA_STACK_ASR": "0",
        "JACANA_STACK_VIDEO": "0",
        "JACANA_ENGINE_PORT": str(engine_port),
        "JACANA_DRAFTER_PORT": str(drafter_port),
        "JACANA_GATEWAY_PORT": str(gateway_port),
        "JACANA_ENGINE_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    log_dir = tmp_path_factory.mktemp("stack-logs")
    process = subprocess.Popen(
        [sys.executable, str(STACK_PY), "--log-dir", str(log_dir), "--grace", "10"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a signal for the stack reaches the stack only
    )
    running = RunningStack(
        process, f"127.0.0.1:{engine_port}", drafter_port, f"http://127.0.0.1:{gateway_port}"
    )
    running.start_reading()
    try:
        running.wait_for(r"Jacana is up", START_TIMEOUT_S)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def chat(base_url: str, **extra) -> str:
    import openai

    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        reply = c.chat.completions.create(
            model=MODEL_ID,
            messages=MESSAGES,
            temperature=0,
            max_tokens=MAX_TOKENS,
            extra_body=extra or None,
        )
    return reply.choices[0].message.content


def ngram_stats(address: str) -> engine_pb2.SpeculativeStats:
    async def get() -> engine_pb2.EngineStats:
        async with make_channel(address) as ch:
            stub = engine_pb2_grpc.EngineStub(ch)
            return await stub.GetStats(engine_pb2.GetStatsRequest(), timeout=5)

    [entry] = asyncio.run(get()).speculative
    assert entry.proposer == "ngram"
    return entry


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_setting_turns_on_remote_drafting_with_unchanged_output(spec_stack, base_url):
    address = f"127.0.0.1:{spec_stack.drafter_port}"
    spec_stack.wait_for(rf"Speculative decoding: ngram, drafted by the drafter at {address}", 1)
    reference = chat(base_url)  # the session's stack: speculation off
    before = ngram_stats(spec_stack.engine)

    assert chat(f"{spec_stack.base_url}/v1") == reference
    after = ngram_stats(spec_stack.engine)
    assert after.proposals > before.proposals
    assert after.accepted_tokens > before.accepted_tokens
    assert after.mean_accepted_length > 1.0
    # the drafts came over the drafter's stream, not from an in-process proposer
    spec_stack.wait_for(r"\[drafter\] .*stream opened: proposer ngram", 5)

    # opted out: the same text, and not one more draft
    assert chat(f"{spec_stack.base_url}/v1", disable_speculation=True) == reference
    assert ngram_stats(spec_stack.engine).proposals == after.proposals


def test_a_dying_drafter_stops_the_stack(spec_stack):
    engine_pid, gateway_pid = spec_stack.pid_of("engine"), spec_stack.pid_of("gateway")
    os.kill(spec_stack.pid_of("drafter"), signal.SIGKILL)
    assert spec_stack.process.wait(60) == 1
    spec_stack.wait_for(r"\[stack\] drafter exited with code -9", 5)
    spec_stack.wait_for(r"\[stack\] stopped", 5)
    assert not alive(engine_pid) and not alive(gateway_pid)
