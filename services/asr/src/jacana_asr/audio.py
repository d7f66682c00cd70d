"""Uploaded audio bytes to Whisper's input: float32 mono samples at 16 kHz.

Decoding is done by the ``ffmpeg`` binary in a subprocess, so every container and codec that
ffmpeg reads (wav, mp3, flac, ogg/opus, m4a, webm, ...) is accepted without a Python codec
library. The upload goes in on ffmpeg's stdin and raw PCM comes out on its stdout: no
temporary files. Three threads (stdin writer, stdout and stderr readers) keep the pipes
moving, so a large upload cannot deadlock against a full output pipe, and a deadline kills
ffmpeg if it stalls.

Output is s16le, as in Whisper's own loader and faster-whisper's: the model was trained on
16-bit audio, the samples stay inside [-1, 1) without clipping, and a 16 kHz s16 wav comes
back bit-exact. Samples past the length limit are counted but not kept, so an hour-long
upload never needs an hour of samples in memory just to be refused.

Every failure is an ``AudioError`` whose message can be shown to the user and whose
``reason`` lets the server pick a status code. Host side only; no torch.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from typing import BinaryIO

import numpy as np

from jacana_asr.transcription import SAMPLE_RATE

_BYTES_PER_SAMPLE = 2  # s16le
_READ_CHUNK = 1 << 16
_STDERR_KEEP = 1 << 14  # ffmpeg's diagnostics beyond this are drained, not kept
_REASON_CHARS = 200  # the longest ffmpeg line quoted back to the user


class AudioError(ValueError):
    """The upload cannot be turned into audio samples.

    message: one sentence for the end user (never ffmpeg's whole log).
    reason: what went wrong, for mapping to a status code:
      "empty" / "undecodable" / "no_audio" -> the client sent bad input (400);
      "too_long" -> the audio exceeds the service's limit (413);
      "timeout" / "unavailable" -> the server could not decode (503).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


def duration_seconds(audio: np.ndarray) -> float:
    """Length in seconds of decoded audio. audio: [samples] at SAMPLE_RATE."""
    return audio.shape[-1] / SAMPLE_RATE


def decode_audio(
    data: bytes,
    *,
    max_seconds: float,
    timeout_s: float = 120.0,
    ffmpeg: str = "ffmpeg",
) -> np.ndarray:
    """Decode one uploaded file to [samples] float32 mono at SAMPLE_RATE, in [-1, 1).

    The first audio stream is used; other streams (video, subtitles, cover art) are ignored;
    multichannel audio is downmixed. max_seconds: longest audio accepted (> 0).
    timeout_s: wall-clock limit for ffmpeg. ffmpeg: the binary's name or path.
    Raises AudioError (see its reasons) on any failure; never hangs past timeout_s.
    """
    if max_seconds <= 0:
        raise ValueError(f"max_seconds must be > 0, got {max_seconds}")
    if not data:
        raise AudioError("The audio file is empty.", reason="empty")

    max_samples = int(max_seconds * SAMPLE_RATE)
    command = [
        ffmpeg,
        "-hide_banner",
        "-nostats",
        "-loglevel",
        "error",
        "-i",
        "pipe:0",
        "-map",
        "0:a:0",
        "-vn",
        "-sn",
        "-dn",
        "-ac",
        "1",
        "-ar",
        str(SAMPLE_RATE),
        "-acodec",
        "pcm_s16le",
        "-f",
        "s16le",
        "pipe:1",
    ]
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:  # FileNotFoundError, PermissionError: no usable binary
        raise AudioError(
            "Audio decoding is unavailable on this server (ffmpeg could not be started).",
            reason="unavailable",
        ) from exc

    output = _PcmSink(max_samples * _BYTES_PER_SAMPLE)
    log = bytearray()
    threads = [
        threading.Thread(target=_feed, args=(process.stdin, data), daemon=True),
        threading.Thread(target=output.drain, args=(process.stdout,), daemon=True),
        threading.Thread(target=_drain_log, args=(process.stderr, log), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        returncode = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AudioError(
            f"Decoding the audio took longer than {timeout_s:g} s and was stopped.",
            reason="timeout",
        ) from None
    finally:
        # The pipes close when ffmpeg exits (or is killed), so the threads end promptly.
        for thread in threads:
            thread.join()

    if returncode != 0:
        raise _failure(log.decode("utf-8", errors="replace"))

    # total bytes counted, not kept: the true length even when refused
    total_samples = output.total_bytes // _BYTES_PER_SAMPLE
    if total_samples == 0:
        raise AudioError("The audio file contains no audio samples.", reason="no_audio")
    if total_samples > max_samples:
        raise AudioError(
            f"The audio is {total_samples / SAMPLE_RATE:.1f} s long; "
            f"the limit is {max_seconds:g} s.",
            reason="too_long",
        )
    pcm = np.frombuffer(bytes(output.kept), dtype="<i2", count=total_samples)
    # audio: [samples] float32 in [-1, 1)
    return pcm.astype(np.float32) / 32768.0


def _failure(log: str) -> AudioError:
    """Turn ffmpeg's error log into one short user-facing AudioError."""
    if "matches no streams" in log:
        return AudioError("The file contains no audio stream.", reason="no_audio")
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    # the last line is the fatal one; the pipe name is noise to the user
    detail = lines[-1].removeprefix("pipe:0:").strip() if lines else "unknown error"
    if len(detail) > _REASON_CHARS:
        detail = detail[:_REASON_CHARS] + "..."
    return AudioError(
        f"The file could not be decoded as audio ({detail}).",
        reason="undecodable",
    )


def _feed(pipe: BinaryIO, data: bytes) -> None:
    """Write the upload to ffmpeg's stdin; ffmpeg may stop reading early (bad data)."""
    try:
        pipe.write(data)
    except (BrokenPipeError, ValueError):  # ValueError: closed after a kill
        pass
    finally:
        with contextlib.suppress(BrokenPipeError):
            pipe.close()


def _drain_log(pipe: BinaryIO, log: bytearray) -> None:
    """Read ffmpeg's stderr to the end, keeping only its first _STDERR_KEEP bytes."""
    while chunk := pipe.read(_READ_CHUNK):
        room = _STDERR_KEEP - len(log)
        if room > 0:
            log += chunk[:room]
    pipe.close()


class _PcmSink:
    """Collects ffmpeg's PCM output up to a byte limit while counting all of it."""

    def __init__(self, keep_bytes: int) -> None:
        # one sample over the limit is enough to know the audio is too long
        self.keep_bytes = keep_bytes + _BYTES_PER_SAMPLE
        self.kept = bytearray()
        self.total_bytes = 0

    def drain(self, pipe: BinaryIO) -> None:
        while chunk := pipe.read(_READ_CHUNK):
            self.total_bytes += len(chunk)
            room = self.keep_bytes - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
        pipe.close()
