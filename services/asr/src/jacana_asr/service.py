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

:meth:`TranscriptionService.transcribe_stream` is the same request streamed: the worker's
per-window callbacks hand each window's new segments to the event loop (one
:class:`WindowDone` per window, through an asyncio queue), and the whole
:class:`Transcription` comes last. Closing the stream early (the caller went away) stops
the worker at the end of the window it is decoding, counted in ``cancelled_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import threading
from collections.abc import AsyncIterator, Iterator
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
    Segment,
    SegmentsCallback,
    TranscribeOptions,
    Transcriber,
    Transcription,
    WindowCallback,
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
    cancelled_total: int = 0  # streamed transcriptions stopped because the caller left


@dataclass(frozen=True)
class WindowDone:
    """One window of a streamed transcription: the segments it closed (maybe none) and the
    seconds of audio done after it."""

    segments: tuple[Segment, ...]
    seconds_done: float


class StreamClosed(Exception):
    """Raised on the worker by the window callback of a stream nobody reads any more."""


_FINISHED = object()  # the queue's last item: the worker returned or raised


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
        self._admitted_count = 0
        self._running = 0
        self._running_lock = threading.Lock()  # _running changes on worker threads
        self._requests_total = 0
        self._rejected_total = 0
        self._cancelled_total = 0  # changes on worker threads, under _running_lock
        self._audio_seconds_total = 0.0

    def stats(self) -> ServiceStats:
        running = self._running
        return ServiceStats(
            running=running,
            waiting=max(self._admitted_count - running, 0),
            requests_total=self._requests_total,
            rejected_total=self._rejected_total,
            audio_seconds_total=self._audio_seconds_total,
            cancelled_total=self._cancelled_total,
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
        options = self._check(model, options)
        with self._admitted():
            samples = await self._decode_upload(audio)
            result = await self._run_model(samples, options, request_id, filename)
        self._count(samples)
        return result

    async def transcribe_stream(
        self,
        audio: bytes,
        options: TranscribeOptions,
        *,
        model: str = "",
        request_id: str = "",
        filename: str = "",
    ) -> AsyncIterator[WindowDone | Transcription]:
        """:meth:`transcribe`, one :class:`WindowDone` per window and the
        :class:`Transcription` last. Raises as :meth:`transcribe` does; closing the
        iterator early stops the transcription at its next window."""
        options = self._check(model, options)
        with self._admitted():
            samples = await self._decode_upload(audio)
            loop = asyncio.get_running_loop()
            events: asyncio.Queue[object] = asyncio.Queue()
            closed = threading.Event()
            pending: list[Segment] = []

            def on_segments(segments: list[Segment]) -> None:
                pending.extend(segments)

            def on_window(seconds_done: float) -> None:
                if closed.is_set():
                    with self._running_lock:
                        self._cancelled_total += 1
                    log.info(
                        "transcription stopped: the caller left (request %r, %.1f of %.1f s)",
                        request_id,
                        seconds_done,
                        duration_seconds(samples),
                    )
                    raise StreamClosed
                done = WindowDone(tuple(pending), seconds_done)
                pending.clear()
                loop.call_soon_threadsafe(events.put_nowait, done)

            running = loop.run_in_executor(
                self._workers, self._on_worker, samples, options, on_window, on_segments
            )
            running.add_done_callback(lambda _: events.put_nowait(_FINISHED))
            try:
                while (event := await events.get()) is not _FINISHED:
                    yield event
                result = await self._outcome(running, samples, request_id, filename)
            finally:
                closed.set()
                running.cancel()  # drops it from the pool's queue if it has not started
                running.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._count(samples)
        yield result

    def _check(self, model: str, options: TranscribeOptions) -> TranscribeOptions:
        if model and model != self.model_id:
            raise ModelNotFoundError(
                f"model {model!r} is not served here (this service serves {self.model_id!r})",
                "model",
            )
        return check_options(options)

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        """Hold one admission for the block; raise OverloadedError when none is left."""
        capacity = self.limits.max_concurrent + self.limits.max_queued
        if self._admitted_count >= capacity:
            self._rejected_total += 1
            raise OverloadedError(
                f"the service is busy ({capacity} requests admitted); retry later"
            )
        self._admitted_count += 1
        try:
            yield
        finally:
            self._admitted_count -= 1

    def _count(self, samples: np.ndarray) -> None:
        self._requests_total += 1
        self._audio_seconds_total += duration_seconds(samples)

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
        running = loop.run_in_executor(self._workers, self._on_worker, samples, options)
        return await self._outcome(running, samples, request_id, filename)

    async def _outcome(
        self,
        running: asyncio.Future[Transcription],
        samples: np.ndarray,
        request_id: str,
        filename: str,
    ) -> Transcription:
        """The worker's result; a model failure logged and raised as
        TranscriptionFailedError."""
        try:
            return await running
        except Exception as exc:
            log.exception(
                "transcription failed (request %r, file %r, %.1f s of audio)",
                request_id,
                filename,
                duration_seconds(samples),
            )
            raise TranscriptionFailedError(f"transcription failed: {exc}") from exc

    def _on_worker(
        self,
        samples: np.ndarray,
        options: TranscribeOptions,
        on_window: WindowCallback | None = None,
        on_segments: SegmentsCallback | None = None,
    ) -> Transcription:
        with self._running_lock:
            self._running += 1
        try:
            if on_window is None:
                return self.transcriber.transcribe(samples, options)
            return self.transcriber.transcribe(samples, options, on_window, on_segments)
        finally:
            with self._running_lock:
                self._running -= 1
