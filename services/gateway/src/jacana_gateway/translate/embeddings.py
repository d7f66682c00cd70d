"""/v1/embeddings between OpenAI and gRPC: the ``EmbedRequest`` for a checked body, and the
OpenAI ``list`` object for the reply. Pure functions, no I/O.

Vectors travel as packed little-endian float32 from the service. ``encoding_format:
"base64"`` sends those bytes as they are (what the official SDK asks for by default and
decodes); ``"float"`` sends the same float32 values as JSON numbers, so both formats give
bit-identical vectors.
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Any

from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2 as pb
from jacana_gateway.schemas.embeddings import EmbeddingsRequest


def embed_request(body: EmbeddingsRequest, messages: Any, **fields: Any) -> Any:
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
