"""Errors the service core raises; the gRPC front maps each to one status code."""

from __future__ import annotations


class AsrError(Exception):
    """Base class. ``param`` names the request field to blame, when one is; ``code`` is
    OpenAI's error code for it, when a more precise one than ``invalid_value`` fits."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequestError(AsrError):
    """The request cannot be served as sent (-> INVALID_ARGUMENT / HTTP 400)."""


class ModelNotFoundError(AsrError):
    """The request names a model this process does not serve (-> NOT_FOUND / HTTP 404)."""


class OverloadedError(AsrError):
    """Every slot is taken; the caller should retry later (-> RESOURCE_EXHAUSTED / 429)."""


class DecoderUnavailableError(AsrError):
    """This replica cannot decode audio at all (no ffmpeg): another replica may
    (-> UNAVAILABLE / HTTP 503)."""


class DecodeTimeoutError(AsrError):
    """Decoding the upload stalled past the limit (-> DEADLINE_EXCEEDED / HTTP 504)."""


class TranscriptionFailedError(AsrError):
    """The model failed on an accepted request: a service fault, logged with its traceback
    (-> INTERNAL, which the gateway shows as a retryable 503)."""


class QueueFullError(OverloadedError):
    """``max_queued_jobs`` jobs wait already (-> RESOURCE_EXHAUSTED / 429 + Retry-After)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, code="queue_full")
        self.retry_after_s = retry_after_s


class JobNotFoundError(AsrError):
    """A job id that never existed, was deleted or expired (-> NOT_FOUND / HTTP 404)."""


class JobNotReadyError(AsrError):
    """The job exists but has no result (yet) (-> FAILED_PRECONDITION / HTTP 400)."""


class JobsDisabledError(AsrError):
    """This replica has no job store configured (-> UNAVAILABLE / HTTP 503)."""
