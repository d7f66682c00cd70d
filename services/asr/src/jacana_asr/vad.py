"""Voice activity: where in a recording someone speaks, by the Silero VAD model.

Three pure steps and the model that feeds them:
- :class:`SileroVad` scores every 32 ms window (512 samples at 16 kHz) with the probability
  that it holds speech. The model is the Silero VAD v6 ONNX export that faster-whisper ships
  in its package (``faster_whisper/assets/silero_vad_v6.onnx``; Silero VAD and
  faster-whisper are both MIT-licensed); it is located without importing faster-whisper,
  whose code this service never runs. onnxruntime runs it on the CPU, one thread.
- :func:`speech_spans` turns the probabilities into padded speech spans (samples), by
  Silero's rule with faster-whisper's defaults (:class:`VadOptions`).
- :class:`TimeMap` maps a time in the speech-only audio (the spans cut out and joined)
  back to the original recording.

The model session is read-only after loading: one :class:`SileroVad` serves every thread.
"""

from __future__ import annotations

import bisect
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jacana_asr.transcription import SAMPLE_RATE

WINDOW = 512  # samples scored at once (32 ms at 16 kHz)
CONTEXT = 64  # samples of the previous window the model sees before each window
_STATE_SHAPE = (1, 1, 128)  # the model's recurrent state (h and c)
_ROWS_PER_RUN = 10_000  # windows per session.run: bounds the input to ~23 MB
# Silence that lets an over-long span be cut there (Silero's rule; 98 ms).
_CUT_SILENCE_SAMPLES = SAMPLE_RATE * 98 / 1000


@dataclass(frozen=True)
class VadOptions:
    """How probabilities become speech spans; the defaults are faster-whisper's.

    threshold: a window at or above it is speech. neg_threshold: inside speech, only a
    window below it counts as silence (None: threshold - 0.15, at least 0.01).
    min_speech_duration_ms: shorter spans are dropped. max_speech_duration_s: a longer span
    is cut at its last silence of 98 ms or more, else just before the limit.
    min_silence_duration_ms: the silence that ends a span. speech_pad_ms: added to each
    side of a span (half the gap when two spans are closer than twice this).
    """

    threshold: float = 0.5
    neg_threshold: float | None = None
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = math.inf
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400


@dataclass(frozen=True)
class Span:
    """[start, end) in samples of the original audio."""

    start: int
    end: int


def silero_model_path() -> Path:
    """The Silero VAD ONNX file inside the installed faster-whisper package."""
    spec = importlib.util.find_spec("faster_whisper")  # finds it without running its code
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the Silero VAD model comes with the faster-whisper package, which is not "
            "installed (pip install faster-whisper)"
        )
    path = Path(spec.submodule_search_locations[0]) / "assets" / "silero_vad_v6.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"no Silero VAD model at {path}")
    return path


class SileroVad:
    """The Silero VAD model in an onnxruntime session (CPU)."""

    def __init__(self, path: str | Path | None = None) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1  # a small recurrent model: threads cost more than they give
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(
            str(path or silero_model_path()),
            sess_options=opts,
            providers=["CPUExecutionProvider"],
        )

    def probabilities(self, audio: np.ndarray) -> np.ndarray:
        """audio: [samples] float32 at 16 kHz -> [ceil(samples / WINDOW)] speech probability
        of each window (the last one zero-padded)."""
        num_windows = -(-len(audio) // WINDOW)
        if num_windows == 0:
            return np.zeros(0, dtype=np.float32)
        # Row i is the CONTEXT samples before window i (zeros before the first) and then
        # window i: [num_windows, CONTEXT + WINDOW].
        padded = np.zeros(CONTEXT + num_windows * WINDOW, dtype=np.float32)
        padded[CONTEXT : CONTEXT + len(audio)] = audio
        rows = np.lib.stride_tricks.sliding_window_view(padded, CONTEXT + WINDOW)[::WINDOW]
        h = np.zeros(_STATE_SHAPE, dtype=np.float32)
        c = np.zeros(_STATE_SHAPE, dtype=np.float32)
        out = []
        # The export steps its recurrent state along the rows; the state carries across runs.
        for i in range(0, num_windows, _ROWS_PER_RUN):
            batch = np.ascontiguousarray(rows[i : i + _ROWS_PER_RUN])
            probs, h, c = self.session.run(None, {"input": batch, "h": h, "c": c})
            out.append(probs.reshape(-1))
        return np.concatenate(out)

    def speech(self, audio: np.ndarray, options: VadOptions = VadOptions()) -> list[Span]:
        """The padded speech spans of ``audio`` ([samples] float32 at 16 kHz)."""
        return speech_spans(self.probabilities(audio), len(audio), options)


def speech_spans(probs: np.ndarray, num_samples: int, options: VadOptions) -> list[Span]:
    """Silero's rule: a span opens at the first window at or above ``threshold`` and closes
    where ``min_silence_duration_ms`` of windows below ``neg_threshold`` began; spans are
    then padded. probs: [windows] one per WINDOW samples; num_samples: the audio's length."""
    threshold = options.threshold
    neg_threshold = options.neg_threshold
    if neg_threshold is None:
        neg_threshold = max(threshold - 0.15, 0.01)
    pad = SAMPLE_RATE * options.speech_pad_ms // 1000
    min_speech = SAMPLE_RATE * options.min_speech_duration_ms / 1000
    min_silence = SAMPLE_RATE * options.min_silence_duration_ms / 1000
    max_speech = SAMPLE_RATE * options.max_speech_duration_s - WINDOW - 2 * pad

    spans: list[tuple[int, int]] = []
    start: int | None = None  # the open span's first sample; None outside speech
    quiet_from: int | None = None  # where the current run of quiet windows began
    cut_at: int | None = None  # end of the open span's last silence of >= 98 ms
    resume_at: int | None = None  # first speech after that silence

    for i, prob in enumerate(probs.tolist()):
        pos = WINDOW * i
        speech = prob >= threshold
        if speech and quiet_from is not None:
            quiet_from = None
            if cut_at is not None and (resume_at is None or resume_at < cut_at):
                resume_at = pos
        if speech and start is None:
            start = pos
            continue
        if start is not None and pos - start > max_speech:
            if cut_at is not None:
                spans.append((start, cut_at))
                # Speech after the cut continues as a new span; none yet: back to silence.
                resumed = resume_at is not None and resume_at >= cut_at
                start = resume_at if resumed else None
                quiet_from = cut_at = resume_at = None
            else:
                spans.append((start, pos))
                start = quiet_from = cut_at = resume_at = None
                continue
        if start is not None and prob < neg_threshold:
            if quiet_from is None:
                quiet_from = pos
            if pos - quiet_from > _CUT_SILENCE_SAMPLES:
                cut_at = quiet_from
            if pos - quiet_from < min_silence:
                continue
            if quiet_from - start > min_speech:
                spans.append((start, quiet_from))
            start = quiet_from = cut_at = resume_at = None
    if start is not None and num_samples - start > min_speech:
        spans.append((start, num_samples))
    return _pad(spans, pad, num_samples)


def _pad(spans: list[tuple[int, int]], pad: int, num_samples: int) -> list[Span]:
    """Widen each span by ``pad`` samples a side, within the audio; two spans closer than
    2 * pad share the gap between them instead."""
    starts = [s for s, _ in spans]
    ends = [e for _, e in spans]
    if starts:
        starts[0] = max(0, starts[0] - pad)
    for i in range(len(spans) - 1):
        gap = starts[i + 1] - ends[i]
        if gap < 2 * pad:
            ends[i] += gap // 2
            starts[i + 1] = max(0, starts[i + 1] - gap // 2)
        else:
            ends[i] = min(num_samples, ends[i] + pad)
            starts[i + 1] = max(0, starts[i + 1] - pad)
    if ends:
        ends[-1] = min(num_samples, ends[-1] + pad)
    return [Span(s, e) for s, e in zip(starts, ends, strict=True)]


def speech_audio(audio: np.ndarray, spans: list[Span]) -> np.ndarray:
    """The spans of ``audio`` joined end to end: [sum of span lengths] float32."""
    if not spans:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([audio[s.start : s.end] for s in spans]).astype(np.float32, copy=False)


class TimeMap:
    """Seconds in the speech-only audio -> seconds in the original recording.

    A time belongs to the span whose joined end comes first after it (the last span past
    the end); a segment's end that falls exactly on a span's joined end stays in that span,
    rather than jumping over the silence that follows it. Results are rounded to 10 ms,
    Whisper's timestamp step.
    """

    def __init__(self, spans: list[Span]) -> None:
        self.joined_ends: list[int] = []  # each span's end in the joined audio (samples)
        self.offsets: list[float] = []  # silence before each span in the original (s)
        joined = 0
        for span in spans:
            joined += span.end - span.start
            self.joined_ends.append(joined)
            self.offsets.append((span.start - (joined - (span.end - span.start))) / SAMPLE_RATE)

    def span_of(self, seconds: float, is_end: bool = False) -> int:
        sample = int(seconds * SAMPLE_RATE)
        if is_end and sample in self.joined_ends:
            return self.joined_ends.index(sample)
        return min(bisect.bisect_right(self.joined_ends, sample), len(self.joined_ends) - 1)

    def original(self, seconds: float, is_end: bool = False, span: int | None = None) -> float:
        """``seconds`` in the joined audio, as seconds of the original; ``span`` forces the
        span (a word's start and end are kept in the span of its middle)."""
        if span is None:
            span = self.span_of(seconds, is_end)
        return round(self.offsets[span] + seconds, 2)
