"""Batching across requests: the 30 s windows of concurrent transcriptions, run together.

``WindowBatcher`` is a ``WindowRunner`` (transcriber.py) shared by every request on one
model. Request threads (the service's ``max_concurrent`` workers) submit work and block on
a future; one loop thread owns the model's batch state and does all of the work:

- encodes: every mel window waiting is encoded in one encoder batch;
- decodes: each window waiting joins the ``DecoderBatch`` (its prompt fed alone, then its
  rows appended), and every step feeds one token to every row of every window at once
  (greedy, beam and sampled rows alike); a window leaves as soon as its search ends and its
  request carries on, so a long recording's windows interleave with short ones.

State: the pending queue (guarded by ``_lock``, shared with request threads) and the decoder
batch and its windows' searches (loop thread only; host side, the caches on the model's
device). Invariants: at most ``max_windows`` windows are decoded at once (more wait in the
queue); each request has at most one window in flight, so the service's ``max_concurrent``
bounds the batch as well. A request's tokens do not depend on what it is batched with: each
row has its own cache and position, each request its own sampling stream.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from jacana_asr.decoder_batch import DecoderBatch
from jacana_asr.sampling import Draws
from jacana_asr.whisper_model import WhisperModel
from jacana_asr.whisper_tokens import WhisperTokens
from jacana_asr.window_decoder import WindowDecoding, WindowOptions, WindowResult


@dataclass
class _Encode:
    mel: torch.Tensor  # [n_mels, n_frames]
    future: Future = field(default_factory=Future)


@dataclass
class _Decode:
    encoded: torch.Tensor  # [1, n_audio_ctx, d_model]
    prompt: list[int]
    options: WindowOptions
    draws: Draws | None
    future: Future = field(default_factory=Future)


class BatcherClosedError(RuntimeError):
    """Work submitted to (or still waiting in) a closed batcher."""


class WindowBatcher:
    """Encodes and decodes the windows of concurrent requests together on one thread."""

    def __init__(self, model: WhisperModel, tokens: WhisperTokens, max_windows: int) -> None:
        if max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {max_windows}")
        self.model, self.tokens, self.max_windows = model, tokens, max_windows
        self._lock = threading.Condition()
        self._encodes: deque[_Encode] = deque()
        self._decodes: deque[_Decode] = deque()
        self._closed = False
        self._thread: threading.Thread | None = None  # started by the first submission
        self._keys = itertools.count()
        # loop thread only:
        self._batch = DecoderBatch(model)
        self._active: dict[int, tuple[WindowDecoding, Future]] = {}
        self.steps = 0  # decoder steps run (each over every active row)
        self.max_batch_windows = 0  # the most windows one step has decoded together

    # -- request threads --------------------------------------------------------------

    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        """mel: [n_mels, n_frames] -> encoder output [1, n_audio_ctx, d_model]."""
        return self._submit(self._encodes, _Encode(mel)).result()

    def decode(
        self,
        encoded: torch.Tensor,
        prompt: list[int],
        options: WindowOptions,
        draws: Draws | None,
    ) -> WindowResult:
        return self._submit(self._decodes, _Decode(encoded, prompt, options, draws)).result()

    def close(self) -> None:
        """Stop the loop: waiting work fails with BatcherClosedError, running windows too."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _submit(self, queue: deque, job) -> Future:
        with self._lock:
            if self._closed:
                raise BatcherClosedError("the model is shutting down")
            queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="asr-batcher", daemon=True)
                self._thread.start()
            self._lock.notify_all()
        return job.future

    # -- loop thread ------------------------------------------------------------------

    @torch.inference_mode()
    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._encodes or self._decodes or self._active or self._closed):
                    self._lock.wait()
                if self._closed:
                    break
                encodes = list(self._encodes)
                self._encodes.clear()
                room = self.max_windows - len(self._active)
                joining = [self._decodes.popleft() for _ in range(min(room, len(self._decodes)))]
            try:
                self._run_encodes(encodes)
                self._admit(joining)
                if self._active:
                    self._step()
            except Exception as exc:  # fail this round's requests, keep serving the rest
                self._fail_all(exc, encodes, joining)
        self._fail_all(BatcherClosedError("the model is shutting down"), [], [])
        with self._lock:
            pending = [*self._encodes, *self._decodes]
            self._encodes.clear()
            self._decodes.clear()
        for job in pending:
            job.future.set_exception(BatcherClosedError("the model is shutting down"))

    @torch.inference_mode()
    def _run_encodes(self, encodes: list[_Encode]) -> None:
        if not encodes:
            return
        mels = torch.stack([job.mel for job in encodes])  # [n, n_mels, n_frames]
        encoded = self.model.encode(mels)  # [n, n_audio_ctx, d_model]
        for i, job in enumerate(encodes):
            job.future.set_result(encoded[i : i + 1].clone())

    def _admit(self, joining: list[_Decode]) -> None:
        for job in joining:
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                decoding = WindowDecoding(job.prompt, self.tokens, job.options, job.draws)
                key = next(self._keys)
                logits = self._batch.add(
                    key, job.encoded, decoding.context, decoding.rows, decoding.no_speech_at
                )
                decoding.start(logits)
            except Exception as exc:  # a bad window fails its own request only
                job.future.set_exception(exc)
                continue
            self._active[key] = (decoding, job.future)

    def _step(self) -> None:
        keys = self._batch.keys()
        spans = [self._batch.span(key) for key in keys]
        inputs = [token for key in keys for token in self._active[key][0].inputs()]
        logits = self._batch.step(inputs)  # [rows, vocab]
        self.steps += 1
        self.max_batch_windows = max(self.max_batch_windows, len(keys))
        for key, (start, stop) in zip(keys, spans, strict=True):
            decoding, future = self._active[key]
            # spans were taken before any window changed its rows: slice first, then edit
            self._batch.continue_rows(key, decoding.advance(logits[start:stop]))
            if decoding.done:
                del self._active[key]
                future.set_result(decoding.result())

    def _fail_all(self, exc: Exception, encodes: list[_Encode], joining: list[_Decode]) -> None:
        for job in [*encodes, *joining]:
            if not job.future.done():
                job.future.set_exception(exc)
        for _, future in self._active.values():
            if not future.done():
                future.set_exception(exc)
        self._active.clear()
        self._batch = DecoderBatch(self.model)
