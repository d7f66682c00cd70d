"""The request body of /v1/embeddings: :class:`EmbeddingsRequest`.

``input`` is a text, a list of texts, a list of token ids or a list of token id lists
(at most ``MAX_INPUTS`` inputs, none empty, ids in [0, 2^32)); :func:`parse_input` turns it
into ``(texts, None)`` or ``(None, token id lists)``. Failures are 400s naming the field,
as for every JSON body (:mod:`jacana_gateway.errors`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic import StrictBool as Bool
from pydantic import StrictInt as Int
from pydantic import StrictStr as Str

from jacana_gateway.schemas.generation import UINT32_MAX
from jacana_gateway.schemas.unicode import reject_lone_surrogates

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request

_TOKENS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_INPUT_SCHEMA = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "maxItems": MAX_INPUTS,
        },
        _TOKENS_SCHEMA,
        {"type": "array", "items": _TOKENS_SCHEMA, "minItems": 1, "maxItems": MAX_INPUTS},
    ],
    "description": "Text, texts, token ids, or lists of token ids (used as given).",
}


def _is_token(value: Any) -> bool:
    return type(value) is int and 0 <= value <= UINT32_MAX


def parse_input(value: Any) -> tuple[list[str] | None, list[list[int]] | None]:
    """OpenAI ``input`` -> (texts, None) or (None, token id lists); ValueError if invalid."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ValueError("must be a non-empty string or a non-empty array")
    if all(_is_token(v) for v in value):
        value = [value]  # one token id list
    if len(value) > MAX_INPUTS:
        raise ValueError(f"at most {MAX_INPUTS} inputs per request (got {len(value)})")
    if all(isinstance(v, str) for v in value):
        for i, text in enumerate(value):
            if not text:
                raise ValueError(f"input[{i}] is an empty string")
        return value, None
    if all(isinstance(v, list) for v in value):
        for i, ids in enumerate(value):
            if not ids:
                raise ValueError(f"input[{i}] is an empty token list")
            if not all(_is_token(t) for t in ids):
                raise ValueError(f"input[{i}]: token ids must be integers in [0, 2^32)")
        return None, value
    raise ValueError("must be a string, an array of strings, or token ids (not a mix)")


class EmbeddingsRequest(BaseModel):
    """Body of POST /v1/embeddings."""

    model_config = ConfigDict(extra="forbid")

    _text_only = model_validator(mode="before")(reject_lone_surrogates)

    model: Str = Field(..., min_length=1, description="An embedding model id.")
    input: Annotated[Any, WithJsonSchema(_INPUT_SCHEMA)] = Field(...)
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="'base64': little-endian float32 bytes, base64-encoded."
    )
    dimensions: Annotated[Int, Field(ge=1, le=65536)] | None = Field(
        None, description="Shorter vectors; only for Matryoshka models (else a 400)."
    )
    truncate: Bool = Field(
        False,
        description="Jacana extension: cut inputs longer than the model's maximum instead "
        "of answering 400.",
    )
    user: Str | None = Field(None, description="Accepted and ignored.")

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> tuple[list[str] | None, list[list[int]] | None]:
        return parse_input(value)
