"""Every failure the client sees, in the OpenAI error shape: the error models, the errors
more than one part of the gateway raises, and the mapping of exceptions to responses.

The shape is ``{"error": {"message", "type", "param", "code"}}`` (:class:`ErrorBody`;
:class:`ApiError` carries one). A check that refuses one field says why where the check
lives (with :class:`ApiError` or :func:`jacana_common.errors.invalid_value`); the errors
below are the gateway's shared vocabulary: unknown model, model of another kind, missing,
unknown or unsupported parameter, body too large, too many requests, bad API key, an
engine that misbehaved, a client that left.

:func:`install_error_handlers` replaces FastAPI's defaults:
- :class:`ApiError` -> its own status and body (and, for :class:`ApiErrorWithHeaders`,
  its headers);
- request validation (FastAPI's 422) -> 400 with ``param`` = the field path, written
  ``messages[0].content``, a query or path parameter by its name alone (malformed JSON,
  bodies that are not UTF-8, nest too deeply or hold an integer too long to parse, and
  non-object bodies -> 400 without param);
- routing errors -> 404 (unknown route) / 405 (method not allowed, with ``Allow``);
  a body above the size limit -> 413;
- a client that disconnected -> an empty 499 nobody receives (for the access log);
- anything unexpected -> 500 ``server_error``, logged with its traceback. That is a gateway
  bug: bad input never gets there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from jacana_common.errors import ApiError

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """The OpenAI error object every failure is reported in."""

    error: ErrorDetail


# The error statuses of the OpenAPI document (a route's ``responses``).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (400, 401, 404, 413, 429, 503, 504)
}


@dataclass
class ApiErrorWithHeaders(ApiError):
    """An :class:`ApiError` whose response carries headers of its own (``Retry-After`` on
    a 429)."""

    headers: dict[str, str] = field(default_factory=dict)


class ClientDisconnected(Exception):
    """The HTTP client went away before its response was complete."""


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model '{model}' does not exist.", "model", "model_not_found")


def model_not_supported(model: str, kind: str, route: str) -> ApiError:
    """``model`` is served here, but by ``route``; ``kind`` says what it is ("an embedding
    model", "not a speech-to-text model")."""
    return ApiError(
        400, f"The model '{model}' is {kind}; use {route}.", "model", "model_not_supported"
    )


def missing_parameter(param: str) -> ApiError:
    return ApiError(
        400, f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
    )


def unknown_parameter(param: str) -> ApiError:
    return ApiError(
        400, f"Unrecognized request argument supplied: {param}", param, "unknown_parameter"
    )


def unsupported_parameter(param: str, why: str) -> ApiError:
    """A well-formed value of ``param`` that asks for something Jacana does not do."""
    return ApiError(400, f"Unsupported value for '{param}': {why}.", param, "unsupported_parameter")


def invalid_api_key() -> ApiError:
    return ApiError(
        401,
        "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
        None,
        "invalid_api_key",
    )


def request_too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"The request body is larger than {limit} bytes.", None, "request_too_large"
    )


def too_many_requests(limit: int) -> ApiError:
    return ApiError(
        429,
        f"The server is at its limit of {limit} concurrent requests; retry later.",
        None,
        "too_many_requests",
    )


def engine_error(message: str) -> ApiError:
    """The engine broke its side of the stream protocol (a 503: retrying may work)."""
    return ApiError(503, message, None, "engine_error")


def engine_unavailable(message: str) -> ApiError:
    return ApiError(503, message, None, "engine_unavailable")


_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.to_dict(), status_code=error.status, headers=headers)


def param_path(loc: Sequence[Any]) -> str | None:
    """``("body", "messages", 0, "content")`` -> ``"messages[0].content"``."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or None


def _describe(error: dict[str, Any], param: str | None) -> str:
    kind = error.get("type", "")
    if kind == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "")
        return (
            f"The request body is not valid JSON ({detail})."
            if detail
            else ("The request body is not valid JSON.")
        )
    if param is None:
        if kind == "missing":
            return "The request body is missing; send a JSON object."
        return "The request body must be a JSON object (send Content-Type: application/json)."
    if kind == "missing":
        return f"Missing required parameter: '{param}'."
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}"
    if kind == "value_error":
        return f"Invalid value for '{param}': {(error.get('ctx') or {}).get('error')}."
    return f"Invalid value for '{param}': {error.get('msg', 'invalid')}."


def validation_error(exc: RequestValidationError) -> ApiError:
    """The first validation failure of a request, as a 400."""
    errors = list(exc.errors())
    if not errors:
        return ApiError(400, "Invalid request.", None, "invalid_request")
    first = errors[0]
    loc = first.get("loc", ())
    if loc and loc[0] in ("query", "path"):
        loc = loc[1:]  # a query or path parameter is named alone: "limit"
    param = None if first.get("type") == "json_invalid" else param_path(loc)
    code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_value"
    if first.get("type") == "extra_forbidden":
        code = "unknown_parameter"
    if param is None:
        code = "invalid_json" if first.get("type") == "json_invalid" else "invalid_body"
    return ApiError(400, _describe(first, param), param, code)


async def _on_api_error(request: Request, exc: ApiError) -> Response:
    headers = exc.headers if isinstance(exc, ApiErrorWithHeaders) else None
    return error_response(exc, headers=headers)


async def _on_validation(request: Request, exc: RequestValidationError) -> Response:
    return error_response(validation_error(exc))


async def _on_http(request: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    if status == 404:
        message = f"Unknown route: {request.method} {request.url.path}"
    elif status == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}."
    elif status == 413:
        message = str(exc.detail or "The request body is too large.")
    elif status == 400 and (unparsed := _why_unparsed(exc.__cause__)):
        return error_response(ApiError(400, unparsed, None, "invalid_json"))
    else:
        message = str(exc.detail)
    error = ApiError(status, message, None, _HTTP_CODES.get(status))
    return error_response(error, headers=getattr(exc, "headers", None))


def _why_unparsed(cause: BaseException | None) -> str | None:
    """What FastAPI's JSON decoding met when it answers "There was an error parsing the
    body" (a 400 raised ``from`` the decoder's exception), in words; None for another
    400."""
    if isinstance(cause, UnicodeDecodeError):
        return "The request body is not valid UTF-8 JSON."
    if isinstance(cause, RecursionError):
        return "The request body nests arrays or objects too deeply to parse."
    if isinstance(cause, ValueError):
        if "digits" in str(cause):  # an integer past Python's conversion limit
            return "The request body holds a number too long to parse."
        return "The request body is not valid JSON."
    return None


async def _on_disconnect(request: Request, exc: ClientDisconnected) -> Response:
    return Response(status_code=499)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(ApiError(500, "Internal server error.", None, "internal_error"))


def install_error_handlers(app: FastAPI) -> None:
    """Route every error of ``app`` through the OpenAI error shape."""
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(HTTPException, _on_http)
    app.add_exception_handler(ClientDisconnected, _on_disconnect)
    app.add_exception_handler(Exception, _on_unexpected)
