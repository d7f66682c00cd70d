"""POST /v1/embeddings: the OpenAI embeddings API over the embeddings service's gRPC API,
and over the engine's ``Embed`` RPC for models an engine serves.

Self-contained: :func:`embeddings_router` returns an ``APIRouter`` whose lifespan opens
one grpc.aio channel per endpoint of ``model -> [host:port, ...]`` and closes them at
shutdown (FastAPI merges a router's lifespan into the app's). Engine-served models go
over the app's engine :class:`ReplicaPool` (opened by the app), whose replicas answer
``Embed`` when they are configured to pool (``JACANA_ENGINE_POOLING``); an engine that
is not answers FAILED_PRECONDITION, shown as a 400 ``model_not_supported`` naming
``model``. Both backends take the same request fields and return the same packed vectors.

Request handling, in order: body shape and limits (400 via FastAPI validation, with
``param``), model served here (404 ``model_not_found``), then the service (its
INVALID_ARGUMENT -> 400 naming ``input`` or ``dimensions``, RESOURCE_EXHAUSTED -> 429,
unreachable -> 503). A replica that answers UNAVAILABLE is skipped for the next one
(embedding is idempotent, so a retry cannot double anything). A client that disconnects
cancels the gRPC call, which drops its queued inputs in the service.

Vectors travel as packed little-endian float32 from the service. ``encoding_format:
"base64"`` sends those bytes as they are (what the official SDK asks for by default and
decodes); ``"float"`` sends the same float32 values as JSON numbers, so both formats give
bit-identical vectors.
"""

from __future__ import annotations

import base64
import json
import sys
from array import array
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic import StrictBool as Bool
from pydantic import StrictInt as Int
from pydantic import StrictStr as Str

from jacana_common.errors import ApiError
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2 as pb
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2_grpc
from jacana_common.pb.jacana.engine.v1 import engine_pb2
from jacana_gateway.disconnect import cancel_on_disconnect
from jacana_gateway.replica_pool import ReplicaPool, ServiceBackends, call_with_failover
from jacana_gateway.unicode_check import reject_lone_surrogates

EMBEDDINGS_SERVICE = "jacana.embeddings.v1.Embeddings"
MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
UINT32_MAX = 2**32 - 1

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


class EmbeddingsBackends(ServiceBackends):
    """Model id -> embeddings service replicas (a :class:`ReplicaPool`), and ``Embed`` calls
    routed over them: least in flight first, a replica that answered UNAVAILABLE last for
    ``retry_after_s``, the next replica tried while one is UNAVAILABLE."""

    service = EMBEDDINGS_SERVICE
    stub = embeddings_pb2_grpc.EmbeddingsStub

    async def embed(self, model: str, request: pb.EmbedRequest, timeout: float) -> pb.EmbedResponse:
        """Call ``Embed`` on the least busy replica, moving on while replicas are UNAVAILABLE.

        Raises :class:`ApiError` for every failure.
        """
        return await call_embed(self.pool, model, request, timeout)


async def call_embed(pool: ReplicaPool, model: str, request: Any, timeout: float) -> Any:
    """``Embed`` on the least busy replica of ``model`` in ``pool`` (embeddings services or
    engines: both stubs have it), moving on while replicas are UNAVAILABLE (embedding is
    idempotent, so a retry cannot double anything). Raises :class:`ApiError`."""
    return await call_with_failover(pool, model, "Embed", request, timeout)


def _grpc_request(body: EmbeddingsRequest, messages: Any, **fields: Any) -> Any:
    """``body`` as ``messages.EmbedRequest``: ``messages`` is the embeddings service's or
    the engine's generated module, whose Embed requests name these fields alike."""
    texts, token_ids = body.input
    # No "model" field: the gateway's name for the model may differ from the backend's.
    request = messages.EmbedRequest(truncate=body.truncate, **fields)
    if texts is not None:
        request.texts.texts.extend(texts)
    else:
        request.token_ids.inputs.extend(messages.TokenIds(ids=ids) for ids in token_ids)
    if body.dimensions is not None:
        request.dimensions = body.dimensions
    return request


async def _engine_embed(
    engines: ReplicaPool, model: str, request: engine_pb2.EmbedRequest, timeout: float
) -> engine_pb2.EmbedResponse:
    try:
        return await call_embed(engines, model, request, timeout)
    except ApiError as exc:
        if exc.status == 400 and exc.param == "model":  # an engine that does not pool
            exc.code = "model_not_supported"
        raise


def _vector_json(packed: bytes, encoding_format: str) -> str | list[float]:
    if encoding_format == "base64":
        return base64.b64encode(packed).decode("ascii")
    values = array("f")
    values.frombytes(packed)
    if sys.byteorder == "big":  # the service sends little-endian float32
        values.byteswap()
    return values.tolist()


def embeddings_response(body: EmbeddingsRequest, reply: pb.EmbedResponse) -> dict[str, Any]:
    """The OpenAI ``list`` object for one Embed reply."""
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": _vector_json(e.packed, body.encoding_format),
            }
            for i, e in enumerate(reply.embeddings)
        ],
        "model": body.model,
        "usage": {
            "prompt_tokens": reply.usage.prompt_tokens,
            "total_tokens": reply.usage.total_tokens,
        },
    }


def _model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model '{model}' does not exist.", "model", "model_not_found")


def embeddings_router(
    backends: EmbeddingsBackends | Mapping[str, Sequence[str]],
    *,
    engines: ReplicaPool | None = None,
    timeout_s: float = 600.0,
) -> APIRouter:
    """``POST /v1/embeddings`` served by ``backends`` (or a ``model -> endpoints`` mapping)
    and, for the models in ``engines`` (the app's engine pool, opened and closed by the
    app), by those engines' ``Embed``.

    ``timeout_s`` is the deadline of one Embed call.
    """
    pool = backends if isinstance(backends, EmbeddingsBackends) else EmbeddingsBackends(backends)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        try:
            yield
        finally:
            await pool.close()

    router = APIRouter(prefix="/v1", tags=["openai"], lifespan=lifespan)

    @router.post("/embeddings", response_model=None)
    async def create_embeddings(body: EmbeddingsRequest, request: Request) -> Response:
        """Vectors for a text, texts or token id lists, in the OpenAI shape."""
        if body.model in pool:
            grpc_request = _grpc_request(body, pb, encoding=pb.VECTOR_ENCODING_PACKED_FLOAT32)
            call = pool.embed(body.model, grpc_request, timeout_s)
        elif engines is not None and body.model in engines:
            grpc_request = _grpc_request(body, engine_pb2)
            call = _engine_embed(engines, body.model, grpc_request, timeout_s)
        else:
            raise _model_not_found(body.model)
        async with cancel_on_disconnect(request.receive):
            reply = await call
        content = json.dumps(embeddings_response(body, reply), separators=(",", ":"))
        return Response(content, media_type="application/json")

    return router
