"""Whisper's log-mel front end: 16 kHz samples to the encoder's input features.

Pure torch functions; they run on whatever device the audio tensor is on (the samples from
``audio.decode_audio`` are numpy on the host and are moved to ``device`` when given).

The recipe is Whisper's: a 400-point STFT (25 ms) every 160 samples (10 ms, so 100 frames a
second) with a periodic Hann window and reflect padding at both ends; power spectrum; a
Slaney-style mel filterbank (librosa's default: Slaney's mel scale, each triangle scaled to
unit area); log10 clamped at 1e-10; everything more than 8 decades under the loudest value
raised to that floor; then (x + 4) / 4 so the features sit roughly in [-1, 1].

Frame convention (as faster-whisper, on which our correctness is checked): the audio is
followed by one hop of silence before the STFT and the result keeps ``samples // HOP_LENGTH``
frames, one per full hop of audio. The encoder sees ``N_FRAMES`` (30 s) at a time;
``mel_window`` cuts one window at a seek offset and pads the tail with zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from jacana_asr.transcription import SAMPLE_RATE

N_FFT = 400  # 25 ms analysis window
HOP_LENGTH = 160  # 10 ms between frames
CHUNK_SECONDS = 30  # the encoder's fixed input span
N_FRAMES = CHUNK_SECONDS * SAMPLE_RATE // HOP_LENGTH  # 3000 frames per window
LOG_FLOOR = 1e-10  # power below this is treated as silence before the log
DYNAMIC_RANGE = 8.0  # decades of log10 power kept under the loudest value

# Slaney's mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above
# (27 mels per factor 6.4 in frequency).
_LINEAR_HZ_PER_MEL = 200.0 / 3.0
_LOG_START_HZ = 1000.0
_LOG_START_MEL = _LOG_START_HZ / _LINEAR_HZ_PER_MEL  # 15 mels
_LOG_STEP = math.log(6.4) / 27.0  # natural log of frequency ratio per mel


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale (librosa ``htk=False``). hz: any shape, float64."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / _LINEAR_HZ_PER_MEL
    with np.errstate(divide="ignore"):  # log of 0 Hz lands in the unused branch
        logarithmic = _LOG_START_MEL + np.log(hz / _LOG_START_HZ) / _LOG_STEP
    return np.where(hz >= _LOG_START_HZ, logarithmic, linear)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    """Inverse of ``hz_to_mel``. mel: any shape, float64."""
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * _LINEAR_HZ_PER_MEL
    logarithmic = _LOG_START_HZ * np.exp(_LOG_STEP * (mel - _LOG_START_MEL))
    return np.where(mel >= _LOG_START_MEL, logarithmic, linear)


def mel_filters(n_mels: int, *, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> torch.Tensor:
    """Triangular mel filterbank with Slaney area normalization, as float32.

    Returns [n_mels, n_fft // 2 + 1]: row m weights the power-spectrum bins of band m.
    Band edges are n_mels + 2 points evenly spaced in mel from 0 Hz to Nyquist; each
    triangle is scaled by 2 / (its width in Hz) so every band has the same area.
    Built in float64 and cast once, so it matches librosa's filters to float32 rounding.
    """
    if n_mels < 1:
        raise ValueError(f"n_mels must be >= 1, got {n_mels}")
    # bin_hz: [n_bins]   edges_hz: [n_mels + 2]
    bin_hz = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    edges_hz = mel_to_hz(np.linspace(0.0, hz_to_mel(sample_rate / 2.0), n_mels + 2))
    widths_hz = np.diff(edges_hz)  # [n_mels + 1]
    # offsets: [n_mels + 2, n_bins], how far each band edge sits above each bin
    offsets = edges_hz[:, None] - bin_hz[None, :]
    rising = -offsets[:-2] / widths_hz[:-1, None]  # [n_mels, n_bins]
    falling = offsets[2:] / widths_hz[1:, None]  # [n_mels, n_bins]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


def log_mel(
    audio: np.ndarray | torch.Tensor,
    n_mels: int = 80,
    *,
    device: torch.device | str | None = None,
    padding_frame: bool = False,
) -> torch.Tensor:
    """Whisper's normalized log-mel spectrogram of a whole recording.

    audio: [samples] float mono at SAMPLE_RATE (numpy or torch). n_mels: the model's
    ``num_mel_bins`` (80, or 128 for large-v3). Returns [n_mels, samples // HOP_LENGTH]
    float32 on ``device`` (default: the audio's device); no frames under one hop of audio.
    Frame t covers the samples centred on t * HOP_LENGTH. The dynamic-range floor is taken
    over the whole recording, so windows cut from it share one scale, as in Whisper.
    ``padding_frame`` keeps the one extra frame computed over the trailing silence
    ([n_mels, frames + 1]): faster-whisper detects the language on features that hold it.
    """
    samples = torch.as_tensor(audio, dtype=torch.float32, device=device)
    if samples.dim() != 1:
        raise ValueError(f"audio must be 1-D [samples], got shape {tuple(samples.shape)}")
    n_frames = samples.shape[0] // HOP_LENGTH
    if n_frames == 0:  # under one hop: nothing to transcribe (and too short to reflect)
        return samples.new_zeros(n_mels, 0)
    # one hop of trailing silence, so the last full hop's frame sees zeros, not a reflection
    padded = torch.nn.functional.pad(samples, (0, HOP_LENGTH))  # [samples + HOP_LENGTH]
    window = torch.hann_window(N_FFT, periodic=True, device=samples.device)
    spectrum = torch.stft(
        padded,
        N_FFT,
        HOP_LENGTH,
        window=window,
        center=True,
        pad_mode="reflect",
        return_complex=True,
    )  # [n_fft // 2 + 1, n_frames + 2]; the last frame mostly hangs past the audio
    power = spectrum[:, :-1].abs() ** 2  # [n_bins, n_frames + 1]
    filters = mel_filters(n_mels).to(samples.device)  # [n_mels, n_bins]
    mel = filters @ power  # [n_mels, n_frames + 1]
    log_spec = torch.clamp(mel, min=LOG_FLOOR).log10()
    # the floor is set over every computed frame (the silent extra one included), as in
    # faster-whisper; only then is that extra frame dropped
    log_spec = torch.maximum(log_spec, log_spec.max() - DYNAMIC_RANGE)
    return ((log_spec + 4.0) / 4.0)[:, : n_frames + int(padding_frame)]


@dataclass(frozen=True)
class MelWindow:
    """One encoder input cut from a recording's features.

    features: [n_mels, N_FRAMES], zero past the end of the recording.
    seek: the first frame's index in the recording (100 frames a second).
    num_frames: how many leading frames are real audio (<= N_FRAMES); the rest is padding.
    """

    features: torch.Tensor
    seek: int
    num_frames: int

    @property
    def start_seconds(self) -> float:
        return self.seek * HOP_LENGTH / SAMPLE_RATE

    @property
    def duration_seconds(self) -> float:
        return self.num_frames * HOP_LENGTH / SAMPLE_RATE


def mel_window(mel: torch.Tensor, seek: int) -> MelWindow:
    """The 30 s window starting at frame ``seek`` of ``mel`` ([n_mels, frames]).

    0 <= seek < frames. Frames past the recording's end are zeros (faster-whisper's
    ``pad_or_trim``, which the model's oracle uses), not the features of silence.
    """
    n_mels, total = mel.shape
    if not 0 <= seek < total:
        raise ValueError(f"seek must be in [0, {total}), got {seek}")
    num_frames = min(N_FRAMES, total - seek)
    features = mel.new_zeros(n_mels, N_FRAMES)  # [n_mels, N_FRAMES]
    features[:, :num_frames] = mel[:, seek : seek + num_frames]
    return MelWindow(features=features, seek=seek, num_frames=num_frames)
