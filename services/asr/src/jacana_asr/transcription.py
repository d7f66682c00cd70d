"""What a transcription request asks for and what it returns: the boundary between the
service's gRPC layer and the model code (pure data, no torch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

SAMPLE_RATE = 16_000  # Whisper's input rate: every decoded upload is resampled to it
DEFAULT_BEAM_SIZE = 5  # faster-whisper's
MIN_BEAM_SIZE, MAX_BEAM_SIZE = 1, 16  # the range a request may ask for


@dataclass(frozen=True)
class TranscribeOptions:
    """One request's decoding choices; the defaults are faster-whisper's.

    language: ISO-639-1 code ("en"), or None to detect it (an English-only model always
    answers "en"). task: "transcribe" keeps the spoken language; "translate" writes English.
    prompt: text that conditions the first window (previous context, spellings).
    temperature: 0 searches, falling back to sampling at 0.2 ... 1.0 where a window loops
    or scores low; above 0 samples with that temperature only.
    beam_size: beams of the search at temperature 0 (1: greedy). best_of: samples drawn
    per window at temperature > 0, the best-scoring kept. patience: a beam search stops
    once round(beam_size * patience) hypotheses have finished. length_penalty: hypotheses
    rank by summed log-probability / length ** length_penalty.
    seed: makes the sampled windows reproducible (the same seed, audio and options give the
    same output); None draws a fresh seed per request.
    vad_filter: transcribe only the stretches the voice-activity model hears speech in
    (vad.py), so silence cannot turn into hallucinated text; None leaves it to the
    service's default for the audio's length.
    word_timestamps: time each word (Segment.words) by cross-attention alignment, as
    faster-whisper's ``word_timestamps=True`` does; segment spans then follow their words.
    """

    language: str | None = None
    task: str = "transcribe"
    prompt: str | None = None
    temperature: float = 0.0
    beam_size: int = DEFAULT_BEAM_SIZE
    best_of: int = 5
    patience: float = 1.0
    length_penalty: float = 1.0
    seed: int | None = None
    vad_filter: bool | None = None
    word_timestamps: bool = False


@dataclass(frozen=True)
class Word:
    """One word with its timing in seconds from the start of the audio.

    word: as written in the segment's text, its leading space and any punctuation joined
    to it included. probability: the mean of its tokens' probabilities.
    """

    word: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True)
class TokenLogprob:
    """One text token as decoded: its text, its UTF-8 bytes (a token may hold part of a
    character; ``token`` then shows U+FFFD for it) and its log-probability."""

    token: str
    bytes: bytes
    logprob: float


@dataclass(frozen=True)
class Segment:
    """A stretch of speech with its timing in seconds from the start of the audio.

    seek: the first mel frame (100 a second) of the 30 s window that produced it.
    words: its words, when word timestamps were asked for (else empty).
    logprobs: its text tokens (timestamps left out), each with its log-probability after
    the decoding rules, in order.
    """

    id: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    temperature: float
    seek: int = 0
    words: tuple[Word, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Transcription:
    """The whole result: text is the segments' texts joined, stripped at both ends."""

    text: str
    language: str
    duration: float
    segments: tuple[Segment, ...] = field(default_factory=tuple)


# Called after each 30 s window with the seconds of audio done; may raise to stop.
WindowCallback = Callable[[float], None]
# Called with the segments a window closed (numbered and timed as in the final
# Transcription), just before that window's WindowCallback; not called for a window that
# closed none.
SegmentsCallback = Callable[[list[Segment]], None]


class Transcriber(Protocol):
    """Speech to text on one loaded model."""

    def transcribe(
        self,
        audio: np.ndarray,
        options: TranscribeOptions,
        on_window: WindowCallback | None = None,
        on_segments: SegmentsCallback | None = None,
    ) -> Transcription:
        """audio: [samples] float32 mono at SAMPLE_RATE, in [-1, 1]."""
        ...
