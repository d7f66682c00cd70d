"""The log-mel front end against faster-whisper's numpy FeatureExtractor on the same audio.

Tolerances: the mel filterbank must equal faster-whisper's ``get_mel_filters`` to float32
rounding (atol 1e-8; both are built in float64 and cast once). The features may differ by
at most 1e-4 (measured: ~3e-5 for 80 mels, ~4e-5 for 128): torch's and numpy's FFTs round
differently in float32 and the log amplifies relative error near the floor; any recipe slip
(window, filter norm, clamp, range, scale) moves values by 1e-2 or more.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from jacana_asr.audio import decode_audio
from jacana_asr.features import (
    HOP_LENGTH,
    N_FRAMES,
    hz_to_mel,
    log_mel,
    mel_filters,
    mel_to_hz,
    mel_window,
)
from jacana_asr.transcription import SAMPLE_RATE

feature_extractor = pytest.importorskip("faster_whisper.feature_extractor")
faster_whisper_audio = pytest.importorskip("faster_whisper.audio")

FEATURE_ATOL = 1e-4


def reference_features(audio: np.ndarray, n_mels: int) -> np.ndarray:
    """faster-whisper's features with its extra last frame dropped, as its transcribe() does
    (content_frames = features.shape[-1] - 1)."""
    return feature_extractor.FeatureExtractor(feature_size=n_mels)(audio)[:, :-1]


@pytest.fixture(scope="module")
def short_audio(speech_wav: Path) -> np.ndarray:
    return decode_audio(speech_wav.read_bytes(), max_seconds=60)


@pytest.fixture(scope="module")
def long_audio(long_speech_wav: Path) -> np.ndarray:
    audio = decode_audio(long_speech_wav.read_bytes(), max_seconds=120)
    assert len(audio) > 31 * SAMPLE_RATE  # spans two encoder windows
    return audio


def test_mel_scale_is_slaney() -> None:
    # linear 200/3 Hz per mel up to 1 kHz, then 27 mels per factor 6.4
    assert hz_to_mel(np.array(1000.0)) == pytest.approx(15.0)
    assert hz_to_mel(np.array(500.0)) == pytest.approx(7.5)
    assert hz_to_mel(np.array(6400.0)) == pytest.approx(15.0 + 27.0)
    assert hz_to_mel(np.array(8000.0)) == pytest.approx(45.245640471924965)  # Whisper's top
    hz = np.array([0.0, 300.0, 999.0, 1000.0, 4321.0, 8000.0])
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(hz)), hz, rtol=1e-12)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_faster_whisper(n_mels: int) -> None:
    ours = mel_filters(n_mels)
    assert ours.dtype == torch.float32 and ours.shape == (n_mels, 201)
    reference = feature_extractor.FeatureExtractor.get_mel_filters(SAMPLE_RATE, 400, n_mels)
    np.testing.assert_allclose(ours.numpy(), reference.astype(np.float32), rtol=0, atol=1e-8)
    # Slaney area normalization: each triangle's area (in Hz) is 1; checked on the bands
    # spanning 6+ FFT bins, where the bin sum estimates the area to within 2%
    bin_hz = SAMPLE_RATE / 400
    edges = mel_to_hz(np.linspace(0.0, hz_to_mel(np.array(8000.0)), n_mels + 2))
    wide = torch.from_numpy((edges[2:] - edges[:-2]) > 6 * bin_hz)
    assert wide.sum() >= 15
    areas = ours[wide].sum(dim=1) * bin_hz
    torch.testing.assert_close(areas, torch.ones_like(areas), rtol=0.03, atol=0)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_short_clip_matches_faster_whisper(short_audio: np.ndarray, n_mels: int) -> None:
    ours = log_mel(short_audio, n_mels)
    reference = reference_features(short_audio, n_mels)
    assert ours.dtype == torch.float32
    assert ours.shape == (n_mels, len(short_audio) // HOP_LENGTH) == reference.shape
    assert np.abs(ours.numpy() - reference).max() < FEATURE_ATOL


def test_cut_mid_speech_matches_faster_whisper(short_audio: np.ndarray) -> None:
    # both ends inside speech, 10 samples past the hop grid: the last frame's window then
    # reaches past the audio (zeros there, as in faster-whisper, not a reflection) and the
    # first frames depend on the reflect padding at the start
    start = SAMPLE_RATE // 2
    cut = short_audio[start : start + 120 * HOP_LENGTH + 10]
    assert np.abs(cut[:400]).max() > 0.01 and np.abs(cut[-400:]).max() > 0.01
    reference = reference_features(cut, 80)
    assert np.abs(log_mel(cut).numpy() - reference).max() < FEATURE_ATOL


def test_sound_in_last_partial_hop_sets_the_floor() -> None:
    # only the extra frame faster-whisper computes and then drops sees this click; it still
    # sets the dynamic-range floor of the silent frames before it, so it must here too
    clicked = np.zeros(50 * HOP_LENGTH + 77, dtype=np.float32)
    clicked[-10:] = 0.99
    ours = log_mel(clicked)
    assert ours.shape == (80, 50)
    reference = reference_features(clicked, 80)
    assert np.abs(ours.numpy() - reference).max() < FEATURE_ATOL
    assert ours.min().item() > -1.5  # lifted above the silence value


def test_long_clip_and_its_windows_match_faster_whisper(long_audio: np.ndarray) -> None:
    ours = log_mel(torch.from_numpy(long_audio))  # torch input works the same
    reference = reference_features(long_audio, 80)
    assert ours.shape == reference.shape
    assert np.abs(ours.numpy() - reference).max() < FEATURE_ATOL

    # the windows faster-whisper's generate_segments feeds the encoder at seek 0 and 3000
    total = reference.shape[-1]
    for seek in (0, N_FRAMES):
        window = mel_window(ours, seek)
        size = min(N_FRAMES, total - seek)
        expected = faster_whisper_audio.pad_or_trim(reference[:, seek : seek + size])
        assert window.features.shape == (80, N_FRAMES)
        assert window.num_frames == size and window.seek == seek
        assert np.abs(window.features.numpy() - expected).max() < FEATURE_ATOL
    assert window.start_seconds == 30.0
    assert window.duration_seconds == pytest.approx(len(long_audio) / SAMPLE_RATE - 30.0, abs=0.01)
    assert torch.all(window.features[:, window.num_frames :] == 0)


def test_features_are_normalized(short_audio: np.ndarray) -> None:
    mel = log_mel(short_audio)
    top = mel.max().item()
    # the floor is 8 decades under the top, then scaled by 1/4: a span of exactly 2
    assert mel.min().item() == pytest.approx(top - 2.0, abs=1e-5)
    assert -1.5 < top < 2.5


def test_silence_and_tiny_inputs() -> None:
    silence = log_mel(np.zeros(SAMPLE_RATE, dtype=np.float32))
    # log10(1e-10) = -10 everywhere -> (-10 + 4) / 4
    torch.testing.assert_close(silence, torch.full((80, 100), -1.5))
    assert log_mel(np.zeros(HOP_LENGTH - 1, dtype=np.float32)).shape == (80, 0)
    assert log_mel(np.zeros(HOP_LENGTH, dtype=np.float32), 128).shape == (128, 1)


def test_rejects_bad_shapes_and_seeks() -> None:
    with pytest.raises(ValueError, match="1-D"):
        log_mel(np.zeros((2, 1600), dtype=np.float32))
    with pytest.raises(ValueError, match="n_mels"):
        mel_filters(0)
    mel = torch.zeros(80, 50)
    for seek in (-1, 50):
        with pytest.raises(ValueError, match="seek"):
            mel_window(mel, seek)
    assert mel_window(mel, 49).num_frames == 1
