"""Errors the engine raises for requests it cannot take."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine rejects; ``param`` names the input field to blame, if any;
    ``code`` is OpenAI's error code where one applies (e.g. "context_length_exceeded")."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
