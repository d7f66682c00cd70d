"""Request strings must be Unicode text.

JSON may escape a lone UTF-16 surrogate (``"\\ud800"``); Python decodes it into a str
that no UTF-8 encoder takes (protobuf to the engine, the tokenizer), so it would fail
far from the request. The request models refuse it up front instead: a 400 whose
``param`` names the field. A paired escape (``"\\ud83d\\ude00"``) is one character and
passes.
"""

from __future__ import annotations

from typing import Any

from jacana_common.errors import ApiError
from jacana_gateway.errors import param_path


def lone_surrogate_at(value: Any, loc: tuple = ()) -> tuple | None:
    """The location (keys and indices) of the first string, or object key, in ``value``
    that holds an unpaired surrogate; None when there is none."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return loc
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            # not ``or``: a key at the top level is found at (), which is falsy
            found = lone_surrogate_at(key, loc)
            if found is None:
                found = lone_surrogate_at(item, (*loc, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = lone_surrogate_at(item, (*loc, index))
            if found is not None:
                return found
    return None


def reject_lone_surrogates(body: Any) -> Any:
    """``body`` unchanged, or a 400 :class:`ApiError` naming where a lone surrogate is.
    For a request model's ``model_validator(mode="before")``."""
    loc = lone_surrogate_at(body)
    if loc is None:
        return body
    param = param_path(loc)
    where = f"'{param}'" if param else "the request body"
    raise ApiError(
        400,
        f"Invalid value for {where}: it holds an unpaired UTF-16 surrogate, which is not "
        "Unicode text.",
        param,
        "invalid_value",
    )
