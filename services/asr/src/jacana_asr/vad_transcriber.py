"""Transcription of the speech only: the voice-activity filter around any Transcriber.

Whisper writes text for silence ("you you you..." over minutes of quiet). With the filter
on, :class:`VadTranscriber` finds the speech spans (vad.py), joins them into one shorter
recording, has the wrapped transcriber run its seek loop over that, and maps every
segment's times back onto the original recording, as faster-whisper's ``vad_filter`` does.
Audio without speech yields empty text without running the model.

Whether a request is filtered: its ``vad_filter`` when set, else on exactly when the audio
is longer than ``min_seconds`` (the service default, ``JACANA_ASR_VAD_MIN_SECONDS``).
Stateless beyond the shared, read-only VAD session: safe from any thread the wrapped
transcriber is.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jacana_asr.segments import FRAMES_PER_SECOND
from jacana_asr.transcription import (
    SAMPLE_RATE,
    Segment,
    SegmentsCallback,
    TranscribeOptions,
    Transcriber,
    Transcription,
    WindowCallback,
)
from jacana_asr.vad import SileroVad, TimeMap, VadOptions, speech_audio


class VadTranscriber:
    """A :class:`Transcriber` that skips what the VAD model hears as non-speech."""

    def __init__(
        self,
        inner: Transcriber,
        vad: SileroVad,
        min_seconds: float,
        vad_options: VadOptions = VadOptions(),
    ) -> None:
        self.inner = inner
        self.vad = vad
        self.min_seconds = min_seconds
        self.vad_options = vad_options

    def filters(self, options: TranscribeOptions, num_samples: int) -> bool:
        if options.vad_filter is not None:
            return options.vad_filter
        return num_samples > self.min_seconds * SAMPLE_RATE

    def transcribe(
        self,
        audio: np.ndarray,
        options: TranscribeOptions,
        on_window: WindowCallback | None = None,
        on_segments: SegmentsCallback | None = None,
    ) -> Transcription:
        """audio: [samples] float32 mono at 16 kHz. ``on_window`` hears seconds of the
        original recording, the whole duration last; ``on_segments`` segments timed on
        it."""
        if not self.filters(options, len(audio)):
            return self.inner.transcribe(audio, options, on_window, on_segments)
        duration = len(audio) / SAMPLE_RATE
        spans = self.vad.speech(audio, self.vad_options)
        if not spans:
            if on_window is not None:
                on_window(duration)
            return Transcription(text="", language=options.language or "en", duration=duration)
        time_map = TimeMap(spans)
        progress = None
        if on_window is not None:

            def progress(seconds: float) -> None:
                on_window(time_map.original(seconds, is_end=True))

        restored = None
        if on_segments is not None:

            def restored(segments: list[Segment]) -> None:
                on_segments([_restore(s, time_map) for s in segments])

        result = self.inner.transcribe(speech_audio(audio, spans), options, progress, restored)
        if on_window is not None:
            on_window(duration)  # the silence after the last span is done too
        return dataclasses.replace(
            result,
            duration=duration,
            segments=tuple(_restore(s, time_map) for s in result.segments),
        )


def _restore(segment: Segment, time_map: TimeMap) -> Segment:
    """``segment`` with its times (and its window's first frame) on the original recording,
    by faster-whisper's rules: an end exactly at a span's joined end stays in that span; a
    word is moved whole, by the span of its middle, and a segment with words then spans
    them."""
    window_start = time_map.original(segment.seek / FRAMES_PER_SECOND)
    seek = round(window_start * FRAMES_PER_SECOND)
    if not segment.words:
        return dataclasses.replace(
            segment,
            start=time_map.original(segment.start),
            end=time_map.original(segment.end, is_end=True),
            seek=seek,
        )
    words = []
    for word in segment.words:
        span = time_map.span_of((word.start + word.end) / 2)
        words.append(
            dataclasses.replace(
                word,
                start=time_map.original(word.start, span=span),
                end=time_map.original(word.end, span=span),
            )
        )
    return dataclasses.replace(
        segment, start=words[0].start, end=words[-1].end, seek=seek, words=tuple(words)
    )
