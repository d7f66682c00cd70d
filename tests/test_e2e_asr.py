"""End to end: the real ASR service (Whisper tiny.en) and gateway processes, driven with the
official openai SDK's ``audio.transcriptions`` / ``audio.translations``.

Clips are spoken by espeak-ng, which tiny.en mishears a little ("quick roundfire stump"
for "quick brown fox jumps"), so the assertions hold to the words it gets right.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from stack import Service
from stack_asr import ASR_MODEL_ID, start_asr, start_asr_gateway

SENTENCE = "The quick brown fox jumps over the lazy dog."
SRT_TIME = r"\d{2}:\d{2}:\d{2},\d{3} --> \d{2}:\d{2}:\d{2},\d{3}"
VTT_TIME = r"\d{2}:\d{2}:\d{2}\.\d{3} --> \d{2}:\d{2}:\d{2}\.\d{3}"
MAX_AUDIO_SECONDS = 20
MAX_BODY_BYTES = 1024 * 1024


def _run(*command: str | Path) -> str:
    done = subprocess.run(
        [str(part) for part in command], check=True, capture_output=True, text=True, timeout=60
    )
    return done.stdout


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sentence as a 16 kHz mono 16-bit wav (espeak-ng + sox) and as a 64 kbit/s mp3
    (ffmpeg; at its default bitrate tiny.en's reading of the clip wavers between runs)."""
    missing = [b for b in ("espeak-ng", "sox", "ffmpeg") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on PATH")
    directory = tmp_path_factory.mktemp("speech")
    raw, wav, mp3 = directory / "raw.wav", directory / "fox.wav", directory / "fox.mp3"
    _run("espeak-ng", "-w", raw, SENTENCE)
    _run("sox", "-R", raw, "-r", "16000", "-c", "1", "-b", "16", wav)
    _run("ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-i", wav, "-b:a", "64k", mp3)
    return {"wav": wav, "mp3": mp3}


@pytest.fixture(scope="module")
def clip_seconds(clips: dict[str, Path]) -> float:
    return float(_run("soxi", "-D", clips["wav"]))


@pytest.fixture(scope="module")
def asr_service() -> Iterator[Service]:
    """Without Redis (no jobs) and with a short length limit, to be crossed by a test."""
    service = start_asr(JACANA_ASR_MAX_AUDIO_SECONDS=str(MAX_AUDIO_SECONDS))
    yield service
    service.stop()


@pytest.fixture(scope="module")
def asr_gateway(asr_service: Service) -> Iterator[Service]:
    service = start_asr_gateway(
        {ASR_MODEL_ID: [asr_service.address]},
        JACANA_GATEWAY_MAX_AUDIO_BODY_BYTES=str(MAX_BODY_BYTES),
    )
    yield service
    service.stop()


@pytest.fixture
def sdk(asr_gateway: Service) -> Iterator[openai.OpenAI]:
    base_url = f"http://{asr_gateway.address}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def _heard_the_fox(text: str, words: tuple[str, ...] = ("quick", "lazy dog")) -> None:
    lowered = text.lower()
    assert all(word in lowered for word in words), text


def test_transcription_of_a_wav(sdk, clips):
    with clips["wav"].open("rb") as audio:
        reply = sdk.audio.transcriptions.create(model=ASR_MODEL_ID, file=audio)
    _heard_the_fox(reply.text)
    assert reply.text == reply.text.strip() and reply.text.startswith("The quick")


def test_verbose_json_has_timed_segments(sdk, clips, clip_seconds):
    with clips["wav"].open("rb") as audio:
        reply = sdk.audio.transcriptions.create(
            model=ASR_MODEL_ID, file=audio, response_format="verbose_json"
        )
    assert reply.language == "english"
    assert reply.duration == pytest.approx(clip_seconds, abs=0.05)
    _heard_the_fox(reply.text)
    assert reply.segments
    for segment in reply.segments:
        assert 0.0 <= segment.start < segment.end <= reply.duration + 0.5
        assert segment.tokens and segment.text.strip()
    assert [s.id for s in reply.segments] == list(range(len(reply.segments)))
    assert "".join(s.text for s in reply.segments).strip() == reply.text


def test_verbose_json_has_timed_words(sdk, clips, clip_seconds):
    with clips["wav"].open("rb") as audio:
        reply = sdk.audio.transcriptions.create(
            model=ASR_MODEL_ID,
            file=audio,
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
        )
    _heard_the_fox(reply.text)
    assert reply.words and reply.segments
    assert " ".join(w.word for w in reply.words) == reply.text
    for previous, word in itertools.pairwise(reply.words):
        assert previous.end <= word.start
    for word in reply.words:
        assert 0.0 <= word.start <= word.end <= clip_seconds + 0.5
    assert reply.words[0].start == reply.segments[0].start  # segments follow their words


@pytest.mark.parametrize("response_format", ["srt", "vtt", "text"])
def test_text_formats(sdk, clips, response_format):
    with clips["wav"].open("rb") as audio:
        reply = sdk.audio.transcriptions.create(
            model=ASR_MODEL_ID, file=audio, response_format=response_format
        )
    assert isinstance(reply, str)
    _heard_the_fox(reply)
    lines = reply.splitlines()
    if response_format == "srt":
        assert lines[0] == "1" and re.fullmatch(SRT_TIME, lines[1]), reply
        assert lines[1].startswith("00:00:00,000 --> ")
    elif response_format == "vtt":
        assert lines[0] == "WEBVTT" and lines[1] == "" and re.fullmatch(VTT_TIME, lines[2])
    else:
        assert len(lines) == 1


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK's own notice
def test_translation_of_english_speech(sdk, clips):
    with clips["wav"].open("rb") as audio:
        reply = sdk.audio.translations.create(model=ASR_MODEL_ID, file=audio)
    _heard_the_fox(reply.text)


def test_an_mp3_upload(sdk, clips):
    with clips["mp3"].open("rb") as audio:
        reply = sdk.audio.transcriptions.create(model=ASR_MODEL_ID, file=audio)
    _heard_the_fox(reply.text, ("quick", "dog"))  # lossy audio: hold to the surest words


def test_a_file_that_is_not_audio_is_a_400_naming_file(sdk):
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.audio.transcriptions.create(model=ASR_MODEL_ID, file=("noise.wav", b"garbage" * 100))
    assert exc.value.status_code == 400
    assert exc.value.body["param"] == "file"


def test_an_unknown_model_is_a_404(sdk, clips):
    with clips["wav"].open("rb") as audio, pytest.raises(openai.NotFoundError) as exc:
        sdk.audio.transcriptions.create(model="whisper-1", file=audio)
    assert exc.value.body["param"] == "model"
    assert exc.value.body["code"] == "model_not_found"


# --- bad input, through the gateway and the real service ----------------------------------


def _refused(sdk, status: int, file, **fields) -> dict:
    with pytest.raises(openai.APIStatusError) as exc:
        sdk.audio.transcriptions.create(model=ASR_MODEL_ID, file=file, **fields)
    assert exc.value.status_code == status, exc.value.body
    return exc.value.body


def test_a_body_over_the_limit_is_a_413(sdk):
    body = _refused(sdk, 413, ("big.wav", b"\0" * (MAX_BODY_BYTES + 1)))
    assert body["code"] == "request_too_large"


@pytest.mark.parametrize(
    "name, data",
    [
        ("empty.wav", b""),
        ("cut.wav", b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00"),  # a header cut short
        ("noise.flac", b"fLaC" + bytes(range(256)) * 16),  # a FLAC tag, then garbage
    ],
)
def test_empty_or_corrupt_audio_is_a_400_naming_file(sdk, name, data):
    body = _refused(sdk, 400, (name, data))
    assert body["param"] == "file" and body["message"]


def test_a_language_that_does_not_exist_is_a_400(sdk, clips):
    with clips["wav"].open("rb") as audio:
        body = _refused(sdk, 400, audio, language="xx")
    assert body["param"] == "language"


def test_word_timestamps_without_verbose_json_are_a_400(sdk, clips):
    with clips["wav"].open("rb") as audio:
        body = _refused(sdk, 400, audio, timestamp_granularities=["word"])
    assert body["param"] == "timestamp_granularities[]"
    assert "verbose_json" in body["message"]


def test_audio_over_the_length_limit_points_to_the_jobs_route(sdk, clips, tmp_path):
    padded = tmp_path / "padded.wav"
    _run("sox", "-R", clips["wav"], padded, "pad", "0", str(MAX_AUDIO_SECONDS))
    with padded.open("rb") as audio:
        body = _refused(sdk, 400, audio)
    assert (body["param"], body["code"]) == ("file", "audio_too_long")
    assert "/v1/audio/transcriptions/jobs" in body["message"]


def test_jobs_without_redis_are_a_503_that_says_so(asr_gateway, clips):
    resp = httpx.post(
        f"http://{asr_gateway.address}/v1/audio/transcriptions/jobs",
        data={"model": ASR_MODEL_ID},
        files={"file": ("fox.wav", clips["wav"].read_bytes())},
        timeout=60,
    )
    assert resp.status_code == 503, resp.text
    error = resp.json()["error"]
    assert error["code"] == "jobs_disabled" and "JACANA_ASR_REDIS_URL" in error["message"]
    job = httpx.get(f"http://{asr_gateway.address}/v1/audio/transcriptions/jobs/transcription_1")
    assert job.status_code == 503 and job.json()["error"]["code"] == "jobs_disabled"


def test_the_vad_filter_drops_silence_and_keeps_the_clock(sdk, clips, tmp_path):
    """Asked for per request (these clips are below the service's 30 s default): pure
    silence is empty text where Whisper alone writes words, and speech after a silent
    lead-in keeps its place on the recording's clock."""
    silence, late = tmp_path / "silence.wav", tmp_path / "late.wav"
    _run("sox", "-R", "-n", "-r", "16000", "-c", "1", "-b", "16", silence, "trim", "0", "15")
    _run("sox", "-R", clips["wav"], late, "pad", "12", "0")
    for vad_filter, heard in ((False, True), (True, False)):
        with silence.open("rb") as audio:
            reply = sdk.audio.transcriptions.create(
                model=ASR_MODEL_ID, file=audio, extra_body={"vad_filter": vad_filter}
            )
        assert bool(reply.text) is heard, reply.text
    with late.open("rb") as audio:
        reply = sdk.audio.transcriptions.create(
            model=ASR_MODEL_ID,
            file=audio,
            response_format="verbose_json",
            extra_body={"vad_filter": True},
        )
    _heard_the_fox(reply.text)
    assert 11.0 < reply.segments[0].start <= 12.0 < reply.segments[-1].end
