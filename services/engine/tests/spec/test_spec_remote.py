"""The engine with the remote transport: drafts come from a real drafter process over
gRPC; when the drafter is down or slower than the deadline the engine decodes without
speculation (same greedy tokens, no request fails) and resumes when it is back."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jacana_common.pb.jacana.drafter.v1 import drafter_pb2, drafter_pb2_grpc
from jacana_engine.sample.params import SamplingParams
from jacana_engine.spec.config import SpeculativeConfig
from stack import free_port

pytestmark = [
    pytest.mark.usefixtures("torch_one_thread"),
    pytest.mark.skipif(
        importlib.util.find_spec("jacana_drafter") is None, reason="jacana-drafter not installed"
    ),
]

PROMPT = [5, 6, 7, 8] * 6
SP = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _wait_serving(address: str) -> None:
    deadline = time.monotonic() + 30
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return
            except grpc.RpcError:
                time.sleep(0.1)
    raise TimeoutError("drafter did not come up")


def _start_drafter(port: int) -> subprocess.Popen:
    env = dict(os.environ, JACANA_DRAFTER_PORT=str(port), JACANA_DRAFTER_HOST="127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-m", "jacana_drafter"], env=env)
    _wait_serving(f"127.0.0.1:{port}")
    return proc


def _remote_engine(toy, address: str, deadline_s: float = 5.0, proposer: str = "ngram"):
    cfg = SpeculativeConfig(
        proposer=proposer,
        num_speculative_tokens=4,
        transport="remote",
        drafter_address=address,
        drafter_deadline_ms=round(deadline_s * 1000),
        drafter_retry_s=0.2,
        dynamic_k=False,
    )
    return toy.engine(speculative=cfg)


def test_drafter_killed_and_restarted(toy):
    port = free_port()
    proc = _start_drafter(port)
    try:
        engine = _remote_engine(toy, f"127.0.0.1:{port}")
        reference = toy.greedy(PROMPT, 24)
        assert engine.generate([PROMPT], SP) == [reference]
        remote = engine.speculator.proposer
        drafted = engine.stats().speculative["ngram"]
        up = drafted.proposals
        assert up > 0 and drafted.accepted_tokens > 0 and remote.connected

        proc.kill()
        proc.wait(timeout=10)
        assert engine.generate([PROMPT], SP) == [reference]  # no request fails
        assert remote.num_disconnects == 1
        down = engine.stats().speculative["ngram"].proposals
        assert down == up  # nothing was verified while the drafter was away

        proc = _start_drafter(port)
        time.sleep(0.3)  # past the retry interval
        assert engine.generate([PROMPT], SP) == [reference]
        assert engine.stats().speculative["ngram"].proposals > down  # speculation resumed
        assert remote.connected
    finally:
        proc.kill()
        proc.wait(timeout=10)


class _RecordingDrafter(drafter_pb2_grpc.DrafterServicer):
    """Keeps every DraftStep it receives; drafts nothing."""

    def __init__(self) -> None:
        self.steps: list[drafter_pb2.DraftStep] = []

    def Draft(self, request_iterator, context):
        for step in request_iterator:
            self.steps.append(step)
            yield drafter_pb2.DraftReply(
                step_id=step.step_id, drafts=[drafter_pb2.Draft() for _ in step.requests]
            )


def test_finished_requests_reach_the_drafter_with_their_final_tokens():
    """A proposer that learns from finished outputs (suffix) must see over the stream the
    history an in-process one gets: the tokens appended after the request's last propose,
    and the whole history of a request the stream never saw."""
    from jacana_engine.spec.proposer import DraftRequest
    from jacana_engine.spec.remote import RemoteProposer

    recorder, port = _RecordingDrafter(), free_port()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    drafter_pb2_grpc.add_DrafterServicer_to_server(recorder, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        remote = RemoteProposer(f"127.0.0.1:{port}", "suffix", deadline_s=5.0)
        remote.propose([DraftRequest("a", [1, 2, 3], 2, 4)])
        remote.finish("a", [1, 2, 3, 4, 5], 2)  # gained 4, 5 since its propose
        remote.finish("b", [7, 8, 9], 1)  # never drafted
        remote.propose([DraftRequest("c", [6], 1, 4)])
        final = {d.request_id: d for d in recorder.steps[-1].finished}
        assert list(final["a"].token_ids) == [4, 5] and not final["a"].full_history
        assert list(final["b"].token_ids) == [7, 8, 9] and final["b"].full_history
        assert final["b"].num_prompt_tokens == 1
        remote.close()
    finally:
        server.stop(0)


class _SlowDrafter(drafter_pb2_grpc.DrafterServicer):
    """Answers every step with a perfect-looking draft, but too late."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.steps = 0

    def Draft(self, request_iterator, context):
        for step in request_iterator:
            self.steps += 1
            time.sleep(self.delay_s)
            yield drafter_pb2.DraftReply(
                step_id=step.step_id,
                drafts=[drafter_pb2.Draft(token_ids=[1] * r.max_draft) for r in step.requests],
            )


def test_slow_drafter_misses_the_deadline_and_the_engine_decodes_alone(toy):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    slow = _SlowDrafter(delay_s=0.2)
    drafter_pb2_grpc.add_DrafterServicer_to_server(slow, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        engine = _remote_engine(toy, f"127.0.0.1:{port}", deadline_s=0.02)
        start = time.monotonic()
        sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        assert engine.generate([PROMPT], sp) == [toy.greedy(PROMPT, 8)]
        assert time.monotonic() - start < 5.0
        remote = engine.speculator.proposer
        assert remote.num_timeouts >= 5 and slow.steps >= 1
        assert engine.stats().speculative["ngram"].proposals == 0
    finally:
        server.stop(0)
