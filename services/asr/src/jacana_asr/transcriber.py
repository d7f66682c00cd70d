"""Whole-recording transcription with one loaded Whisper model (our torch implementation).

Owns the seek loop over 30 s windows: each window is encoded, decoded with the previous
windows' text as its prompt, cut at its timestamp pairs into segments, and the next window
starts where the last closed segment ended. Decisions follow faster-whisper's defaults, the
service's reference:
- temperature 0 asks for the fallback schedule 0, 0.2, ... 1.0: a window is first searched
  (beam search of ``beam_size``, or greedy), and one whose text loops (zlib compression
  ratio > 2.4) or scores low (average log-probability < -1) is decoded again hotter, by
  best-of-``best_of`` sampling; a temperature above 0 samples once at that temperature
  (OpenAI's rule);
- every sampled window of a request draws from one stream seeded by the request's ``seed``
  (sampling.Draws, CTranslate2's generator), in window order;
- a window the model calls silent (no-speech probability > 0.6 and a low score) is skipped;
- after a window decoded above 0.5 the text prompt restarts, so a hallucination does not
  condition the rest.
- with ``word_timestamps``, a window's segments are timed word by word (a teacher-forced
  alignment pass, word_timestamps.py), their spans follow their words, and the next window
  starts after the last word unless the window ended in silence.
Everything runs on ``device``; the host sees only token ids and scores.

Windows run through a ``WindowRunner``: batching.py's ``WindowBatcher`` (the default)
encodes and decodes the windows of concurrent requests together on one loop thread;
``SoloRunner`` decodes each window alone on the calling thread. A request's output is the
same either way.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from tokenizers import Tokenizer

from jacana_asr import word_timestamps
from jacana_asr.batching import WindowBatcher
from jacana_asr.ct2_checkpoint import load_checkpoint
from jacana_asr.features import N_FRAMES, MelWindow, log_mel, mel_window
from jacana_asr.sampling import Draws
from jacana_asr.segments import FRAMES_PER_SECOND, WindowSplit, compression_ratio, split_window
from jacana_asr.transcription import (
    SAMPLE_RATE,
    Segment,
    SegmentsCallback,
    TokenLogprob,
    TranscribeOptions,
    Transcription,
    WindowCallback,
)
from jacana_asr.whisper_model import WhisperModel
from jacana_asr.whisper_tokens import WhisperTokens, load_whisper_tokens, token_bytes
from jacana_asr.window_decoder import WindowOptions, WindowResult, decode_window

MAX_LENGTH = 448  # the decoder's positions (n_text_ctx): prompt + output of one window
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
DEFAULT_BATCH_WINDOWS = 16


@dataclass(frozen=True)
class Thresholds:
    """When a window is decoded again hotter, skipped as silence, or resets the prompt."""

    compression_ratio: float = 2.4
    log_prob: float = -1.0
    no_speech: float = 0.6
    prompt_reset_temperature: float = 0.5


class WindowRunner(Protocol):
    """Runs the model on windows: may be called from several threads at once."""

    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        """mel: [n_mels, n_frames] one window -> encoder output [1, n_audio_ctx, d_model]."""
        ...

    def decode(
        self,
        encoded: torch.Tensor,
        prompt: list[int],
        options: WindowOptions,
        draws: Draws | None,
    ) -> WindowResult: ...

    def close(self) -> None:
        """Stop; work still waiting fails."""
        ...


class SoloRunner:
    """Each window on the calling thread, alone."""

    def __init__(self, model: WhisperModel, tokens: WhisperTokens) -> None:
        self.model, self.tokens = model, tokens

    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        return self.model.encode(mel[None])

    def decode(self, encoded, prompt, options, draws) -> WindowResult:
        return decode_window(self.model, encoded, prompt, self.tokens, options, draws)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Attempt:
    result: WindowResult
    compression_ratio: float


class WhisperTranscriber:
    """A Whisper checkpoint (CTranslate2 layout) loaded for transcription.

    Thread-safe when its runner is (the service calls it from ``max_concurrent`` workers):
    the model's weights are only read, and each call keeps its own state.
    """

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        thresholds: Thresholds = Thresholds(),
        max_batch_windows: int | None = DEFAULT_BATCH_WINDOWS,
    ) -> None:
        """max_batch_windows: windows of concurrent calls decoded together; None decodes
        each call's windows alone on its own thread."""
        model_dir = Path(model_dir)
        self.model = WhisperModel(load_checkpoint(model_dir), device=device)
        self.tokens: WhisperTokens = load_whisper_tokens(model_dir, self.model.config.n_vocab)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.thresholds = thresholds
        self.runner: WindowRunner = (
            SoloRunner(self.model, self.tokens)
            if max_batch_windows is None
            else WindowBatcher(self.model, self.tokens, max_batch_windows)
        )

    def close(self) -> None:
        """Stop the runner (calls still waiting for the model fail)."""
        self.runner.close()

    def transcribe(
        self,
        audio: np.ndarray,
        options: TranscribeOptions,
        on_window: WindowCallback | None = None,
        on_segments: SegmentsCallback | None = None,
    ) -> Transcription:
        """audio: [samples] float32 mono at 16 kHz. See the module docstring for the loop.
        ``on_window(seconds_done)`` is called after each window, ``on_segments(new)`` just
        before it with the segments that window closed (when it closed any); an exception
        either raises (a cancelled job, a client gone) stops the transcription and
        propagates."""
        tokens = self.tokens
        # [n_mels, frames + 1]: the last frame only ever serves language detection
        padded_mel = log_mel(
            audio, self.model.config.n_mels, device=self.model.device, padding_frame=True
        )
        mel = padded_mel[:, :-1]
        total_frames = mel.shape[1]
        history: list[int] = []  # every kept segment's tokens: later windows' prompts
        if options.prompt:
            history = self._encode_text(" " + options.prompt.strip())
        prompt_reset_since = 0
        draws = Draws(secrets.randbits(32) if options.seed is None else options.seed)
        language = options.language if tokens.is_multilingual else "en"
        segments: list[Segment] = []
        last_speech = 0.0  # where the last word ended (word timestamps)
        seek = 0
        while seek < total_frames:
            window = mel_window(mel, seek)
            encoded = self.runner.encode(window.features)  # [1, n_audio_ctx, d_model]
            if language is None:
                language = self._detect_language(self._detection_input(padded_mel, encoded))
            previous = history[prompt_reset_since:][-(MAX_LENGTH // 2 - 1) :]
            prompt = ([tokens.sot_prev, *previous] if previous else []) + tokens.sot_sequence(
                language, options.task, timestamps=True
            )
            attempt, temperature = self._decode_with_fallback(encoded, prompt, options, draws)
            result = attempt.result
            if result.no_speech_prob > self.thresholds.no_speech and not (
                result.avg_logprob > self.thresholds.log_prob
            ):
                seek += window.num_frames  # silence: faster-whisper skips it the same way
                if on_window is not None:
                    on_window(min(seek, total_frames) / FRAMES_PER_SECOND)
                continue
            split = split_window(
                list(result.tokens),
                timestamp_begin=tokens.timestamp_begin,
                seek=seek,
                window_frames=window.num_frames,
            )
            pieces, words, next_seek = split.segments, [()] * len(split.segments), split.next_seek
            if options.word_timestamps:
                worded = self._words(
                    encoded, language, options.task, split, seek, window, last_speech
                )
                pieces, words, last_speech = worded.segments, worded.words, worded.last_speech
                next_seek = word_timestamps.next_seek(split, worded, seek)
            closed, offset = len(segments), 0
            for piece, piece_words in zip(pieces, words, strict=True):
                logprobs = self._logprobs(result, offset, piece.tokens)
                offset += len(piece.tokens)
                text = self._decode_text(piece.tokens)
                if piece.start == piece.end or not text.strip():
                    continue
                history.extend(piece.tokens)
                segments.append(
                    Segment(
                        id=len(segments),
                        start=piece.start,
                        end=piece.end,
                        text=text,
                        tokens=piece.tokens,
                        avg_logprob=result.avg_logprob,
                        compression_ratio=attempt.compression_ratio,
                        no_speech_prob=result.no_speech_prob,
                        temperature=temperature,
                        seek=seek,
                        words=piece_words,
                        logprobs=logprobs,
                    )
                )
            if temperature > self.thresholds.prompt_reset_temperature:
                prompt_reset_since = len(history)
            seek = next_seek
            if on_segments is not None and len(segments) > closed:
                on_segments(segments[closed:])
            if on_window is not None:
                on_window(min(seek, total_frames) / FRAMES_PER_SECOND)
        return Transcription(
            text="".join(s.text for s in segments).strip(),
            language=language or "en",
            duration=len(audio) / SAMPLE_RATE,
            segments=tuple(segments),
        )

    def _decode_with_fallback(
        self,
        encoded: torch.Tensor,
        prompt: list[int],
        options: TranscribeOptions,
        draws: Draws,
    ) -> tuple[_Attempt, float]:
        """Decode one window, hotter each time the result loops or scores low."""
        schedule = FALLBACK_TEMPERATURES if options.temperature == 0 else (options.temperature,)
        limits = self.thresholds
        attempts: list[tuple[_Attempt, float]] = []
        for temperature in schedule:
            window_options = WindowOptions(
                max_length=MAX_LENGTH,
                temperature=temperature,
                beam_size=options.beam_size,
                patience=options.patience,
                best_of=options.best_of,
                length_penalty=options.length_penalty,
            )
            result = self.runner.decode(encoded, prompt, window_options, draws)
            attempt = _Attempt(result, compression_ratio(self._decode_text(result.tokens).strip()))
            attempts.append((attempt, temperature))
            loops = attempt.compression_ratio > limits.compression_ratio
            scores_low = result.avg_logprob < limits.log_prob
            if self._is_silence(result) or not (loops or scores_low):
                return attempt, temperature
        # Every attempt failed: keep the best-scoring one that does not loop, if any.
        not_looping = [a for a in attempts if a[0].compression_ratio <= limits.compression_ratio]
        best, _ = max(not_looping or attempts, key=lambda a: a[0].result.avg_logprob)
        return best, schedule[-1]

    def _logprobs(
        self, result: WindowResult, offset: int, tokens: tuple[int, ...]
    ) -> tuple[TokenLogprob, ...]:
        """The text tokens of the segment cut from ``result`` at ``offset``, with their
        log-probabilities (timestamps left out)."""
        scores = result.token_logprobs[offset : offset + len(tokens)]
        if len(scores) != len(tokens):  # a runner that reports no token scores
            return ()
        out = []
        for token, score in zip(tokens, scores, strict=True):
            if token < self.tokens.eot:
                raw = token_bytes(self.tokenizer.id_to_token(token))
                out.append(TokenLogprob(raw.decode("utf-8", errors="replace"), raw, score))
        return tuple(out)

    def _is_silence(self, result: WindowResult) -> bool:
        return (
            result.no_speech_prob > self.thresholds.no_speech
            and result.avg_logprob < self.thresholds.log_prob
        )

    def _words(
        self,
        encoded: torch.Tensor,
        language: str,
        task: str,
        split: WindowSplit,
        seek: int,
        window: MelWindow,
        last_speech: float,
    ) -> word_timestamps.WordedWindow:
        """The words of one window's segments (word_timestamps.py)."""
        return word_timestamps.window_words(
            self.model,
            self.tokens,
            self.tokenizer.decode,
            encoded,
            self.tokens.sot_sequence(language, task, timestamps=True),
            language,
            split.segments,
            seek=seek,
            num_frames=window.num_frames,
            last_speech=last_speech,
        )

    def _detection_input(self, padded_mel: torch.Tensor, encoded: torch.Tensor) -> torch.Tensor:
        """The encoder output language detection reads, as faster-whisper's transcribe
        computes it: the first 30 s of the features with their padding frame. For a
        recording under 30 s that frame falls inside the window, so it is encoded apart;
        otherwise the first decode window's ``encoded`` is the same thing."""
        if padded_mel.shape[1] > N_FRAMES:
            return encoded
        return self.runner.encode(mel_window(padded_mel, 0).features)  # [1, ctx, d_model]

    def language_probabilities(self, audio: np.ndarray) -> dict[str, float]:
        """P(language) of ``audio`` ([samples] float32 at 16 kHz) as ``transcribe`` detects
        it when ``language`` is unset: on the first 30 s with the padding frame."""
        padded_mel = log_mel(
            audio, self.model.config.n_mels, device=self.model.device, padding_frame=True
        )
        encoded = self.runner.encode(mel_window(padded_mel, 0).features)
        logits = self._language_logits(encoded)
        probs = torch.softmax(logits.float(), dim=-1).tolist()
        return dict(zip(self.tokens.languages, probs, strict=True))

    @torch.inference_mode()
    def _language_logits(self, encoded: torch.Tensor) -> torch.Tensor:
        """[languages] logits of each language token after <|sot|>, in the order of
        ``tokens.languages``."""
        cache = self.model.new_cache(encoded)
        sot = torch.tensor([[self.tokens.sot]], device=self.model.device)
        logits = self.model.decode(sot, cache)[0, -1]  # [vocab]
        ids = torch.tensor(list(self.tokens.languages.values()), device=logits.device)
        return logits[ids]

    def _detect_language(self, encoded: torch.Tensor) -> str:
        """The most likely language on this encoder output."""
        codes = list(self.tokens.languages)
        return codes[int(self._language_logits(encoded).argmax())]

    def _encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _decode_text(self, ids: tuple[int, ...] | list[int]) -> str:
        return self.tokenizer.decode([t for t in ids if t < self.tokens.eot])
