"""Errors the service core raises; the gRPC front maps each to one status code."""

from __future__ import annotations


class EmbeddingsError(Exception):
    """Base class; ``param`` names the request field to blame, when one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self):
        # Pickled with ``param`` (tokenizer workers send these back to the service).
        return (type(self), (self.message, self.param))


class InvalidRequestError(EmbeddingsError):
    """The request cannot be served as sent (-> INVALID_ARGUMENT / HTTP 400)."""


class ModelNotFoundError(EmbeddingsError):
    """The request names a model this process does not serve (-> NOT_FOUND / HTTP 404)."""


class OverloadedError(EmbeddingsError):
    """The queue is full; the caller should retry later (-> RESOURCE_EXHAUSTED / HTTP 429)."""


class ModelLoadError(Exception):
    """The model directory is missing something or holds something this service cannot run."""
