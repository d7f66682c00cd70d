"""The speech-to-text service core, independent of the transport: validate, admit,
decode the upload, run the model, count.

Owns the admission count and one thread pool of ``max_concurrent`` workers, the only
threads that call the :class:`Transcriber` (so a model that is not thread-safe is safe at
``max_concurrent=1``). Validation happens before anything is decoded; decoding (ffmpeg in a
subprocess, :func:`jacana_asr.audio.decode_audio`) runs on the default executor, so a bad
upload is refused without waiting behind the transcriptions queued for the model.

At most ``max_concurrent + max_queued`` requests are admitted at once; the next one is
refused with :class:`OverloadedError` at once rather than queued without bound. A request
cancelled while its transcription waits for a worker is dropped from the pool's queue; one
cancelled while running finishes on its worker (a model call cannot be interrupted), which
keeps that worker busy until then.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from jacana_asr.audio import AudioError, decode_audio, duration_seconds
from jacana_asr.errors import (
    DecoderUnavailableError,
    DecodeTimeoutError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    TranscriptionFailedError,
)
from jacana_asr.languages import LANGUAGE_NAMES
from jacana_asr.transcription import (
    MAX_BEAM_SIZE,
    MIN_BEAM_SIZE,
    TranscribeOptions,
    Transcriber,
    Transcription,
)

log = logging.getLogger(__name__)

TASKS = ("transcribe", "translate")
AUDIO_TOO_LONG = "audio_too_long"  # OpenAI-style code of a 400 for audio past the limit


@dataclass(frozen=True)
class ServiceLimits:
    """What the service accepts and how much it runs at once.

    max_audio_seconds: longest decoded audio accepted. max_concurrent: transcriptions on
    the model at once (worker threads). max_queued: admitted requests waiting beyond
    those. decode_timeout_s: wall-clock limit of one ffmpeg decode. ffmpeg: its binary.
    """

    max_audio_seconds: float
    max_concurrent: int
    max_queued: int
    decode_timeout_s: float = 120.0
    ffmpeg: str = "ffmpeg"


@dataclass(frozen=True)
class ServiceStats:
    running: int
    waiting: int
    requests_total: int
    rejected_total: int
    audio_seconds_total: float


def check_options(options: TranscribeOptions) -> TranscribeOptions:
    """``options`` with the language lowercased and an empty prompt or language unset.

    Raises :class:`InvalidRequestError` naming the field: an unknown language code, a task
    other than transcribe/translate, a temperature outside [0, 1], a beam_size outside
    [MIN_BEAM_SIZE, MAX_BEAM_SIZE].
    """
    if options.task not in TASKS:
        raise InvalidRequestError(
            f"task must be one of {', '.join(TASKS)} (got {options.task!r})", "task"
        )
    temperature = options.temperature
    if not (math.isfinite(temperature) and 0.0 <= temperature <= 1.0):
        raise InvalidRequestError(
            f"temperature must be between 0 and 1 (got {temperature})", "temperature"
        )
    if not MIN_BEAM_SIZE <= options.beam_size <= MAX_BEAM_SIZE:
        raise InvalidRequestError(
            f"beam_size must be between {MIN_BEAM_SIZE} and {MAX_BEAM_SIZE} "
            f"(got {options.beam_size})",
            "beam_size",
        )
    language = (options.language or "").strip().lower() or None
    if language is not None and language not in LANGUAGE_NAMES:
        raise InvalidRequestError(
            f"language {options.language!r} is not supported; send an ISO-639-1 code such "
            "as 'en', or leave it out to detect the language",
            "language",
        )
    return dataclasses.replace(options, language=language, prompt=options.prompt or None)


def audio_error(exc: AudioError) -> Exception:
    """The service error for a failed decode, by its reason."""
    if exc.reason == "unavailable":
        return DecoderUnavailableError(exc.message)
    if exc.reason == "timeout":
        return DecodeTimeoutError(exc.message)
    if exc.reason == "too_long":
        return InvalidRequestError(exc.message, "file", AUDIO_TOO_LONG)
    return InvalidRequestError(exc.message, "file")  # empty, undecodable, no_audio


class TranscriptionService:
    """``await transcribe(audio, options) -> Transcription`` on one loaded model."""

    def __init__(
        self,
        transcriber: Transcriber,
        *,
        model_id: str,
        device: str,
        limits: ServiceLimits,
    ) -> None:
        self.transcriber = transcriber
        self.model_id = model_id
        self.device = device
        self.limits = limits
        self._workers = ThreadPoolExecutor(limits.max_concurrent, thread_name_prefix="asr-model")
        self._admitted = 0
        self._running = 0
        self._running_lock = threading.Lock()  # _running changes on worker threads
        self._requests_total = 0
        self._rejected_total = 0
        self._audio_seconds_total = 0.0

    def stats(self) -> ServiceStats:
        running = self._running
        return ServiceStats(
            running=running,
            waiting=max(self._admitted - running, 0),
            requests_total=self._requests_total,
            rejected_total=self._rejected_total,
            audio_seconds_total=self._audio_seconds_total,
        )

    async def close(self) -> None:
        """Drop queued transcriptions; running ones finish on their threads."""
        self._workers.shutdown(wait=False, cancel_futures=True)

    async def transcribe(
        self,
        audio: bytes,
        options: TranscribeOptions,
        *,
        model: str = "",
        request_id: str = "",
        filename: str = "",
    ) -> Transcription:
        """Decode ``audio`` (an uploaded file's bytes) and transcribe it.

        Raises InvalidRequestError / ModelNotFoundError / OverloadedError /
        DecoderUnavailableError / DecodeTimeoutError / TranscriptionFailedError.
        """
        if model and model != self.model_id:
            raise ModelNotFoundError(
                f"model {model!r} is not served here (this service serves {self.model_id!r})",
                "model",
            )
        options = check_options(options)
        capacity = self.limits.max_concurrent + self.limits.max_queued
        if self._admitted >= capacity:
            self._rejected_total += 1
            raise OverloadedError(
                f"the service is busy ({capacity} requests admitted); retry later"
            )
        self._admitted += 1
        try:
            samples = await self._decode_upload(audio)
            result = await self._run_model(samples, options, request_id, filename)
        finally:
            self._admitted -= 1
        self._requests_total += 1
        self._audio_seconds_total += duration_seconds(samples)
        return result

    async def _decode_upload(self, audio: bytes) -> np.ndarray:
        limits = self.limits
        try:
            return await asyncio.to_thread(
                decode_audio,
                audio,
                max_seconds=limits.max_audio_seconds,
                timeout_s=limits.decode_timeout_s,
                ffmpeg=limits.ffmpeg,
            )
        except AudioError as exc:
            raise audio_error(exc) from None

    async def _run_model(
        self, samples: np.ndarray, options: TranscribeOptions, request_id: str, filename: str
    ) -> Transcription:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._workers, self._on_worker, samples, options)
        except Exception as exc:
            log.exception(
                "transcription failed (request %r, file %r, %.1f s of audio)",
                request_id,
                filename,
                duration_seconds(samples),
            )
            raise TranscriptionFailedError(f"transcription failed: {exc}") from exc

    def _on_worker(self, samples: np.ndarray, options: TranscribeOptions) -> Transcription:
        with self._running_lock:
            self._running += 1
        try:
            return self.transcriber.transcribe(samples, options)
        finally:
            with self._running_lock:
                self._running -= 1
