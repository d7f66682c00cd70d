"""Errors the video service core raises on purpose; ``server`` maps each to one gRPC
status (and the gateway to one HTTP status)."""

from __future__ import annotations


class VideoServiceError(Exception):
    """Base class. ``param`` names the request field to blame, when one is; ``code`` is
    OpenAI's error code, when a more precise one than ``invalid_value`` fits."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidVideoRequest(VideoServiceError):
    """The request cannot be served as sent (-> INVALID_ARGUMENT / 400)."""


class NotFound(VideoServiceError):
    """Unknown model, or a video id that never existed, was deleted or expired
    (-> NOT_FOUND / 404)."""


class NotReady(VideoServiceError):
    """The video exists but is not completed (-> FAILED_PRECONDITION / 400)."""


class QueueFull(VideoServiceError):
    """``max_queued`` renders wait already (-> RESOURCE_EXHAUSTED / 429 + Retry-After)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, code="queue_full")
        self.retry_after_s = retry_after_s
