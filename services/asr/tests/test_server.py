"""The gRPC surface of the speech-to-text service, served in-process by the real
GrpcServer on a free loopback port, for every request refused before the model runs.

The transcriber here is never reached: each request below is refused by validation,
admission or audio decoding (the real ffmpeg) first, and :class:`Unreachable` fails the
test if it is called. Transcriptions that need a model come with the model.
"""

from __future__ import annotations

import asyncio
import io
import time
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jacana_asr.__main__ import SERVICE_NAME
from jacana_asr.server import AsrServicer, decode_options
from jacana_asr.service import ServiceLimits, TranscriptionService
from jacana_asr.settings import AsrSettings
from jacana_asr.transcription import SAMPLE_RATE, TranscribeOptions, Transcription
from jacana_common.errors import api_error_from_grpc, parse_grpc_details
from jacana_common.grpc_client import make_channel
from jacana_common.grpc_server import GrpcServer
from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_common.pb.jacana.asr.v1 import asr_pb2_grpc

MODEL_ID = "whisper-test"
MAX_SECONDS = 1.0


class Unreachable:
    """A Transcriber that must never run: every request in this module is refused first."""

    def __init__(self) -> None:
        self.calls = 0

    def transcribe(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        self.calls += 1
        raise AssertionError("the model was reached")


def wav_bytes(seconds: float) -> bytes:
    """A 16 kHz mono s16 wav of a quiet tone."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    samples = (0.1 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(samples.tobytes())
    return out.getvalue()


@pytest.fixture
def transcriber() -> Unreachable:
    return Unreachable()


@pytest.fixture
def limits() -> ServiceLimits:
    return ServiceLimits(max_audio_seconds=MAX_SECONDS, max_concurrent=1, max_queued=0)


@asynccontextmanager
async def serving(
    transcriber: Unreachable, limits: ServiceLimits
) -> AsyncIterator[grpc.aio.Channel]:
    """The servicer on the real GrpcServer at a free loopback port; a channel to it."""
    service = TranscriptionService(transcriber, model_id=MODEL_ID, device="cpu", limits=limits)
    server = GrpcServer(SERVICE_NAME, AsrSettings(port=0, shutdown_grace_s=1))
    asr_pb2_grpc.add_AsrServicer_to_server(AsrServicer(service), server.server)
    port = await server.start()
    try:
        async with make_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop()
        await service.close()
    assert transcriber.calls == 0


@pytest.fixture
async def channel(transcriber, limits) -> AsyncIterator[grpc.aio.Channel]:
    async with serving(transcriber, limits) as ch:
        yield ch


@pytest.fixture
def stub(channel) -> asr_pb2_grpc.AsrStub:
    return asr_pb2_grpc.AsrStub(channel)


async def refusal(stub, **fields) -> tuple[grpc.StatusCode, str, str | None, str | None]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Transcribe(pb.TranscribeRequest(**fields))
    message, param, code = parse_grpc_details(info.value.details())
    return info.value.code(), message, param, code


async def test_health_and_model_info(channel, stub):
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", SERVICE_NAME):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert (info.model_id, info.device, info.max_audio_seconds) == (MODEL_ID, "cpu", MAX_SECONDS)
    assert (info.max_concurrent, info.max_queued) == (1, 0)


@pytest.mark.parametrize(
    "audio, needle",
    [
        (b"", "empty"),
        (b"this is not audio at all" * 100, ""),
        (b"RIFF\x24\x00\x00\x00WAVEfmt ", ""),  # a truncated wav header
    ],
)
async def test_bad_audio_is_invalid_argument_naming_file(stub, audio, needle):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Transcribe(pb.TranscribeRequest(audio=audio))
    # what the gateway will show: a 400 naming the file, one sentence (not ffmpeg's log)
    error = api_error_from_grpc(info.value.code(), info.value.details())
    assert (error.status, error.param, error.code) == (400, "file", "invalid_value")
    assert needle in error.message and "\n" not in error.message


async def test_audio_over_the_limit_is_audio_too_long(stub):
    code, message, param, error_code = await refusal(stub, audio=wav_bytes(MAX_SECONDS + 0.5))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (param, error_code) == ("file", "audio_too_long")
    assert "1.5 s" in message


async def test_unknown_model_is_not_found(stub):
    code, _, param, _ = await refusal(stub, audio=wav_bytes(0.5), model="other-model")
    assert (code, param) == (grpc.StatusCode.NOT_FOUND, "model")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"language": "xx"}, "language"),
        ({"language": "english"}, "language"),
        ({"temperature": 1.01}, "temperature"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"beam_size": 0}, "beam_size"),
        ({"beam_size": 17}, "beam_size"),
        ({"task": 7}, "task"),
    ],
)
async def test_bad_options_are_invalid_argument(stub, fields, param):
    code, _, blamed, _ = await refusal(stub, audio=wav_bytes(0.5), **fields)
    assert (code, blamed) == (grpc.StatusCode.INVALID_ARGUMENT, param)


def test_beam_size_and_seed_are_optional_fields():
    unset = decode_options(pb.TranscribeRequest())
    assert (unset.beam_size, unset.seed) == (5, None)  # faster-whisper's beam; a fresh seed
    chosen = decode_options(pb.TranscribeRequest(beam_size=1, seed=0))
    assert (chosen.beam_size, chosen.seed) == (1, 0)


def test_vad_filter_is_unset_or_chosen_per_request():
    assert decode_options(pb.TranscribeRequest()).vad_filter is None  # the service's default
    assert decode_options(pb.TranscribeRequest(vad_filter=False)).vad_filter is False
    assert decode_options(pb.TranscribeRequest(vad_filter=True)).vad_filter is True


def test_word_timestamps_are_asked_for_per_request():
    assert not decode_options(pb.TranscribeRequest()).word_timestamps
    assert decode_options(pb.TranscribeRequest(word_timestamps=True)).word_timestamps


@pytest.mark.parametrize("limits", [ServiceLimits(1.0, 1, 0, ffmpeg="/nonexistent/ffmpeg")])
async def test_no_ffmpeg_is_unavailable(stub):
    code, message, _, _ = await refusal(stub, audio=wav_bytes(0.5))
    assert code == grpc.StatusCode.UNAVAILABLE and "ffmpeg" in message


async def test_stats_count_nothing_for_refusals(stub):
    await refusal(stub, audio=b"")
    stats = await stub.GetStats(pb.GetStatsRequest())
    assert (stats.running, stats.waiting, stats.requests_total) == (0, 0, 0)
    assert stats.audio_seconds_total == 0.0


@pytest.fixture
def stalling_ffmpeg(tmp_path: Path) -> str:
    """An "ffmpeg" that never answers: decoding can only end by the service's deadline."""
    script = tmp_path / "ffmpeg"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    return str(script)


async def test_a_full_service_refuses_at_once_and_a_stalled_decode_times_out(
    transcriber, stalling_ffmpeg
):
    limits = ServiceLimits(MAX_SECONDS, 1, 0, decode_timeout_s=1.0, ffmpeg=stalling_ffmpeg)
    async with serving(transcriber, limits) as channel:
        stub = asr_pb2_grpc.AsrStub(channel)

        async def first_request():
            return await stub.Transcribe(pb.TranscribeRequest(audio=wav_bytes(0.5)))

        first = asyncio.create_task(first_request())
        deadline = time.monotonic() + 5
        while (await stub.GetStats(pb.GetStatsRequest())).waiting == 0:
            assert time.monotonic() < deadline, "the first request was never admitted"
            await asyncio.sleep(0.01)
        code, message, _, _ = await refusal(stub, audio=wav_bytes(0.5))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry" in message
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await first
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        stats = await stub.GetStats(pb.GetStatsRequest())
        assert (stats.rejected_total, stats.waiting, stats.requests_total) == (1, 0, 0)


def test_a_transcription_travels_whole():
    from jacana_asr.server import encode_response
    from jacana_asr.transcription import Segment, TokenLogprob, Word

    hello = (Word(" Hello.", 0.0, 0.62, 0.875),)
    tokens = (TokenLogprob(" Hello", b" Hello", -0.125), TokenLogprob(".", b".", -0.5))
    segments = (
        Segment(
            *(0, 0.0, 2.5, " Hello.", (50363, 15947, 13, 50488), -0.25, 1.2, 0.01, 0.0, 0),
            words=hello,
            logprobs=tokens,
        ),
        Segment(1, 0.29, 33.0, " Again.", (50363, 6521, 13), -0.5, 1.1, 0.02, 0.2, 29),
    )
    result = Transcription("Hello. Again.", "en", 33.0, segments)
    encoded = encode_response(result, MODEL_ID, logprobs=True)
    wire = pb.TranscribeResponse.FromString(encoded.SerializeToString())
    assert (wire.text, wire.language, wire.language_name) == ("Hello. Again.", "en", "english")
    assert (wire.duration, wire.model_id) == (33.0, MODEL_ID)
    for sent, got in zip(segments, wire.segments, strict=True):
        for name, value in vars(sent).items():
            received = getattr(got, name)
            if name == "words":
                received = tuple(Word(w.word, w.start, w.end, w.probability) for w in received)
            if name == "logprobs":
                received = tuple(TokenLogprob(t.token, t.bytes, t.logprob) for t in received)
            assert (tuple(received) if name == "tokens" else received) == value, name
    plain = encode_response(result, MODEL_ID)  # token log-probabilities only when asked
    assert [list(s.logprobs) for s in plain.segments] == [[], []]
