"""End to end: streamed transcriptions (``stream=True``) through the real ASR service
(Whisper tiny.en) and gateway processes, consumed by the official openai SDK.

The deltas of a recording over two 30 s windows add up to the done event's text, which
equals the non-streaming transcription, and their token log-probabilities spell them;
closing the stream after its first delta stops the service's transcription of a long
recording at its next window (the service's stats count it cancelled, not served, and its
log says where it stopped).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import openai
import pytest

from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_common.pb.jacana.asr.v1 import asr_pb2_grpc
from stack import Service
from stack_asr import ASR_MODEL_ID, speech_wav, start_asr, start_asr_gateway

LONG_REPEATS = 8  # the two-window recording 8 times over: about five minutes


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 38 s of distinct sentences: two windows."""
    return speech_wav(tmp_path_factory.mktemp("speech"), "sentences")


@pytest.fixture(scope="module")
def long_recording(recording: Path) -> Path:
    out = recording.with_name("long.wav")
    subprocess.run(
        ["sox", "-R", *[str(recording)] * LONG_REPEATS, str(out)], check=True, timeout=60
    )
    return out


@pytest.fixture(scope="module")
def asr_service() -> Iterator[Service]:
    service = start_asr(JACANA_ASR_MAX_AUDIO_SECONDS="600", JACANA_ASR_MAX_CONCURRENT="1")
    yield service
    service.stop()


@pytest.fixture(scope="module")
def sdk(asr_service: Service) -> Iterator[openai.OpenAI]:
    gateway = start_asr_gateway({ASR_MODEL_ID: [asr_service.address]})
    base_url = f"http://{gateway.address}/v1"
    try:
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300) as c:
            yield c
    finally:
        gateway.stop()


def stats(service: Service) -> pb.AsrStats:
    with grpc.insecure_channel(service.address) as channel:
        return asr_pb2_grpc.AsrStub(channel).GetStats(pb.GetStatsRequest(), timeout=10)


def test_the_deltas_add_up_to_the_transcription(sdk, recording):
    with recording.open("rb") as audio:
        stream = sdk.audio.transcriptions.create(
            model=ASR_MODEL_ID, file=audio, stream=True, include=["logprobs"]
        )
        events = list(stream)
    *deltas, done = events
    assert [e.type for e in deltas] == ["transcript.text.delta"] * len(deltas)
    assert done.type == "transcript.text.done"
    assert len(deltas) >= 4  # a delta per segment, over both windows
    assert "".join(e.delta for e in deltas) == done.text
    assert "quick" in done.text.lower() and "bridge" in done.text.lower()
    assert done.usage.type == "tokens" and done.usage.output_tokens > len(deltas)
    # each delta's tokens spell it (the first one's leading space aside)
    for event in deltas:
        spelled = b"".join(bytes(t.bytes) for t in event.logprobs).decode()
        assert spelled.strip() == event.delta.strip()
        assert all(t.logprob <= 0 for t in event.logprobs)
    assert [t.token for t in done.logprobs] == [t.token for e in deltas for t in e.logprobs]

    with recording.open("rb") as audio:
        whole = sdk.audio.transcriptions.create(model=ASR_MODEL_ID, file=audio)
    assert whole.text == done.text


def test_closing_the_stream_stops_the_transcription(sdk, asr_service, long_recording):
    before = stats(asr_service)
    with long_recording.open("rb") as audio:
        stream = sdk.audio.transcriptions.create(model=ASR_MODEL_ID, file=audio, stream=True)
        first = next(iter(stream))
        assert first.type == "transcript.text.delta" and first.delta
        stream.close()
    deadline = time.monotonic() + 60  # at most one more window to decode
    while (now := stats(asr_service)).running or now.cancelled_total == before.cancelled_total:
        assert time.monotonic() < deadline, asr_service.log_tail()
        time.sleep(0.2)
    assert now.cancelled_total == before.cancelled_total + 1
    assert now.requests_total == before.requests_total  # never finished
    assert now.audio_seconds_total == before.audio_seconds_total
    assert "transcription stopped: the caller left" in asr_service.log_tail(200)
