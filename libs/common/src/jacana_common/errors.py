"""The OpenAI error model and the mapping from gRPC status codes to it.

Every error a client sees has the shape
``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


@dataclass
class ApiError(Exception):
    """An error with an HTTP status that is shown to the client in the OpenAI shape."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message

    @property
    def type(self) -> str:
        return _TYPE_BY_STATUS.get(self.status, "invalid_request_error")

    def to_dict(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


INVALID_VALUE = "invalid_value"  # the code of a 400 that names the bad field


def invalid_value(message: str, param: str | None) -> ApiError:
    """The 400 for a request field whose value (or combination) cannot be served."""
    return ApiError(400, message, param, INVALID_VALUE)


# How a backend's gRPC status is shown over HTTP.
_HTTP_BY_GRPC = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.CANCELLED: 499,
}


def api_error_from_grpc(code: grpc.StatusCode, details: str | None) -> ApiError:
    """Translate a backend's gRPC failure into the error the HTTP client sees.

    Backends put ``param=<name>`` on the first line of ``details`` when one input field is
    to blame (see :func:`grpc_details`); it becomes the OpenAI ``param``.
    """
    status = _HTTP_BY_GRPC.get(code, 503 if code == grpc.StatusCode.UNKNOWN else 500)
    message, param, error_code = parse_grpc_details(details or code.name.lower())
    if status == 500:
        # An internal backend fault: the client gets a retryable 503, never a 500.
        status = 503
    if status == 499:
        status = 503
    if error_code is None and status == 400 and param is not None:
        error_code = INVALID_VALUE  # as the gateway's own checks name a bad field
    return ApiError(status=status, message=message, param=param, code=error_code)


def grpc_details(message: str, param: str | None = None, code: str | None = None) -> str:
    """Encode a message, the blamed field and OpenAI's error code for a gRPC status'
    details: a ``param=<name>`` line and a ``code=<code>`` line, each where given, then
    the message."""
    head = [f"{key}={value}" for key, value in (("param", param), ("code", code)) if value]
    return "\n".join([*head, message])


def parse_grpc_details(details: str) -> tuple[str, str | None, str | None]:
    """Inverse of :func:`grpc_details`: (message, param, code)."""
    found: dict[str, str] = {}
    while True:
        head, newline, rest = details.partition("\n")
        key, equals, value = head.partition("=")
        if not newline or not equals or key not in ("param", "code") or key in found:
            return details, found.get("param"), found.get("code")
        found[key] = value
        details = rest
