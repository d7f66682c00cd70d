"""TranscribeStream over the real GrpcServer and service on a free loopback port: one event
per window with its new segments, the whole response last, errors before the first event,
and a cancelled call stopping the transcription at its next window.

The transcriber is :class:`Windows`, a Whisper-free Transcriber that closes one segment a
window and takes ``pause_s`` over each, so that what the service streams, and where it
stops, is known; the upload is a real clip decoded by the real ffmpeg. Streaming with the
model is tested end to end (tests/test_e2e_asr.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import numpy as np
import pytest

from jacana_asr.__main__ import SERVICE_NAME
from jacana_asr.server import AsrServicer
from jacana_asr.service import ServiceLimits, TranscriptionService
from jacana_asr.settings import AsrSettings
from jacana_asr.transcription import (
    SAMPLE_RATE,
    Segment,
    SegmentsCallback,
    TokenLogprob,
    TranscribeOptions,
    Transcription,
    WindowCallback,
)
from jacana_common.grpc_client import make_channel
from jacana_common.grpc_server import GrpcServer
from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_common.pb.jacana.asr.v1 import asr_pb2_grpc

MODEL_ID = "whisper-test"
WORD = (TokenLogprob(" window", b" window", -0.25),)  # every segment's first token


class Windows:
    """``windows`` windows of ``pause_s`` each, one segment per window ("window 0." ...),
    an empty window (no segments) after every other one; counts the windows it decoded."""

    def __init__(self, windows: int, pause_s: float) -> None:
        self.windows, self.pause_s = windows, pause_s
        self.decoded = 0
        self.finished = threading.Event()  # set when transcribe returns or raises

    def transcribe(
        self,
        audio: np.ndarray,
        options: TranscribeOptions,
        on_window: WindowCallback | None = None,
        on_segments: SegmentsCallback | None = None,
    ) -> Transcription:
        segments: list[Segment] = []
        try:
            for i in range(self.windows):
                time.sleep(self.pause_s)
                self.decoded += 1
                if i % 2 == 0:
                    segment = Segment(
                        len(segments), i, i + 1, f" window {i}.", (), -0.1, 1, 0, 0, logprobs=WORD
                    )
                    segments.append(segment)
                    if on_segments is not None:
                        on_segments([segment])
                if on_window is not None:
                    on_window(i + 1.0)
        finally:
            self.finished.set()
        text = "".join(s.text for s in segments).strip()
        return Transcription(text, "en", len(audio) / SAMPLE_RATE, tuple(segments))


@asynccontextmanager
async def serve(transcriber: Windows) -> AsyncIterator[asr_pb2_grpc.AsrStub]:
    """The servicer over ``transcriber`` on the real GrpcServer; a stub of it."""
    limits = ServiceLimits(max_audio_seconds=60, max_concurrent=1, max_queued=1)
    service = TranscriptionService(transcriber, model_id=MODEL_ID, device="cpu", limits=limits)
    server = GrpcServer(SERVICE_NAME, AsrSettings(port=0, shutdown_grace_s=1))
    asr_pb2_grpc.add_AsrServicer_to_server(AsrServicer(service), server.server)
    port = await server.start()
    try:
        async with make_channel(f"127.0.0.1:{port}") as channel:
            yield asr_pb2_grpc.AsrStub(channel)
    finally:
        await server.stop()
        await service.close()


@pytest.fixture
async def quick() -> AsyncIterator[tuple[asr_pb2_grpc.AsrStub, Windows]]:
    transcriber = Windows(windows=5, pause_s=0.0)
    async with serve(transcriber) as stub:
        yield stub, transcriber


@pytest.fixture
async def slow() -> AsyncIterator[tuple[asr_pb2_grpc.AsrStub, Windows]]:
    transcriber = Windows(windows=50, pause_s=0.1)
    async with serve(transcriber) as stub:
        yield stub, transcriber


async def test_each_window_is_streamed_then_the_whole_response(quick, speech_wav):
    stub, _ = quick
    call = stub.TranscribeStream(pb.TranscribeRequest(audio=speech_wav.read_bytes()))
    events = [event async for event in call]
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds == ["segments"] * 5 + ["done"]
    streamed = [s for e in events[:-1] for s in e.segments.segments]
    assert [len(e.segments.segments) for e in events[:-1]] == [1, 0, 1, 0, 1]
    assert [e.seconds_done for e in events[:-1]] == [1.0, 2.0, 3.0, 4.0, 5.0]
    done = events[-1].done
    assert list(done.segments) == streamed and done.model_id == MODEL_ID
    assert done.text == "window 0. window 2. window 4."
    assert events[-1].seconds_done == done.duration > 0
    stats = await stub.GetStats(pb.GetStatsRequest())
    assert (stats.requests_total, stats.cancelled_total, stats.running) == (1, 0, 0)


async def test_errors_come_before_the_first_event(quick):
    stub, transcriber = quick
    for request, code in [
        (pb.TranscribeRequest(audio=b"not audio"), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.TranscribeRequest(audio=b"x", model="other"), grpc.StatusCode.NOT_FOUND),
        (pb.TranscribeRequest(audio=b"x", language="xx"), grpc.StatusCode.INVALID_ARGUMENT),
    ]:
        call = stub.TranscribeStream(request)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == code
    assert transcriber.decoded == 0


async def test_a_cancelled_call_stops_the_transcription(slow, speech_wav):
    stub, transcriber = slow
    call = stub.TranscribeStream(pb.TranscribeRequest(audio=speech_wav.read_bytes()))
    first = await call.read()
    assert first.WhichOneof("event") == "segments"
    call.cancel()
    assert await asyncio.to_thread(transcriber.finished.wait, 5)
    assert transcriber.decoded < 5  # of 50 windows: it stopped at the next one
    deadline = time.monotonic() + 5
    while (stats := await stub.GetStats(pb.GetStatsRequest())).running:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert (stats.cancelled_total, stats.requests_total, stats.waiting) == (1, 0, 0)
    # the worker is free again: the next stream runs to its end
    transcriber.windows, transcriber.pause_s = 2, 0.0
    request = pb.TranscribeRequest(audio=speech_wav.read_bytes())
    events = [e async for e in stub.TranscribeStream(request)]
    assert events[-1].done.text == "window 0."


async def test_token_logprobs_are_sent_when_asked(quick, speech_wav):
    stub, _ = quick
    for asked in (False, True):
        request = pb.TranscribeRequest(audio=speech_wav.read_bytes(), logprobs=asked)
        events = [e async for e in stub.TranscribeStream(request)]
        segments = [*events[0].segments.segments, *events[-1].done.segments]
        want = [pb.TokenLogprob(token=" window", bytes=b" window", logprob=-0.25)] * asked
        assert all(list(s.logprobs) == want for s in segments)
        reply = await stub.Transcribe(request)
        assert all(list(s.logprobs) == want for s in reply.segments) and reply.segments
