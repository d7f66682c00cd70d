"""Speech clips synthesized on the fly (espeak-ng + sox), shared by the audio front-end tests.

Session-scoped: synthesizing and encoding take a fraction of a second each, done once.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Speech recognition turns spoken words into written text.",
    "Please call Stella and ask her to bring these things from the store.",
)


def _run(*command: str | Path) -> None:
    subprocess.run([str(part) for part in command], check=True, capture_output=True, timeout=60)


def _need(*binaries: str) -> None:
    missing = [name for name in binaries if shutil.which(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on PATH")


def synthesize(directory: Path, name: str, sentence: str, voice: str = "en") -> Path:
    """A 16 kHz mono 16-bit wav of ``sentence`` spoken by espeak-ng's ``voice`` (a language
    code)."""
    _need("espeak-ng", "sox")
    raw = directory / f"{name}.raw.wav"
    clip = directory / f"{name}.wav"
    _run("espeak-ng", "-v", voice, "-w", raw, sentence)
    _run("sox", "-R", raw, "-r", "16000", "-c", "1", "-b", "16", clip)
    return clip


def _encode(source: Path | str, target: Path, *options: str) -> Path:
    _need("ffmpeg")
    _run("ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-i", source, *options, target)
    return target


@pytest.fixture(scope="session")
def encode():
    """encode(source, target, *options) -> target: re-encode a file with ffmpeg. The codec
    follows the target's suffix unless options name one; options come after ``-i source``,
    so they may also add inputs (``-f lavfi -i testsrc``) and ``-map`` streams."""
    return _encode


@pytest.fixture(scope="session")
def synthesize_clip():
    """synthesize_clip(directory, name, sentence, voice="en") -> a 16 kHz mono wav of
    espeak-ng speech."""
    return synthesize


@pytest.fixture(scope="session")
def speech_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("speech")


@pytest.fixture(scope="session")
def speech_wav(speech_dir: Path) -> Path:
    """About 3 s of one sentence: 16 kHz, mono, s16 wav."""
    return synthesize(speech_dir, "short", SENTENCES[0])


# Distinct sentences for the long recording: repeated text would make Whisper's output
# compress well, which sends a window into the (sampled) temperature fallback.
LONG_SENTENCES = (
    *SENTENCES,
    "Seven ships sailed north along the rocky coast before dawn.",
    "My grandmother grows tomatoes, beans and sunflowers in her garden.",
    "The library closes early on Sundays during the summer holidays.",
    "A train to the capital leaves every hour from platform nine.",
    "Heavy rain is expected tomorrow afternoon across the western valleys.",
    "The orchestra rehearsed the new symphony for three long weeks.",
    "Please remember to water the plants and feed the cat on Friday.",
    "Engineers measured the bridge again after the storm had passed.",
)


@pytest.fixture(scope="session")
def long_speech_wav(speech_dir: Path) -> Path:
    """Over 30 s (two encoder windows): distinct sentences joined with sox."""
    clips = [synthesize(speech_dir, f"part{i}", text) for i, text in enumerate(LONG_SENTENCES)]
    joined = speech_dir / "long.wav"
    _run("sox", "-R", *clips, joined)
    return joined
