"""POST /v1/embeddings: the OpenAI embeddings API over the embeddings services' gRPC API,
and over the engine's ``Embed`` RPC for models an engine serves.

Request handling, in order: body shape and limits (400 via FastAPI validation, with
``param``, :mod:`jacana_gateway.schemas.embeddings`), model served here (404
``model_not_found``), then the service (its INVALID_ARGUMENT -> 400 naming ``input`` or
``dimensions``, RESOURCE_EXHAUSTED -> 429, unreachable -> 503; an engine that does not pool
-> 400 ``model_not_supported``, :mod:`jacana_gateway.backends.embeddings`). A replica that
answers UNAVAILABLE is skipped for the next one. A client that disconnects cancels the
gRPC call, which drops its queued inputs in the service. Both backends take the same
request fields and return the same packed vectors
(:mod:`jacana_gateway.translate.embeddings`).
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import Response

from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2 as pb
from jacana_common.pb.jacana.engine.v1 import engine_pb2
from jacana_gateway.backends.embeddings import engine_embed
from jacana_gateway.errors import model_not_found
from jacana_gateway.middleware.disconnect import cancel_on_disconnect
from jacana_gateway.middleware.metrics import label_model
from jacana_gateway.schemas.embeddings import EmbeddingsRequest
from jacana_gateway.state import GatewayState
from jacana_gateway.translate.embeddings import embed_request, embeddings_response


def build_router(state: GatewayState) -> APIRouter:
    """``POST /v1/embeddings`` served by ``state.embeddings`` and, for the models of
    ``state.pool``, by those engines' ``Embed``."""
    router = APIRouter(prefix="/v1", tags=["openai"])
    services, engines = state.embeddings, state.pool
    timeout_s = state.settings.request_timeout_s

    @router.post("/embeddings", response_model=None)
    async def create_embeddings(body: EmbeddingsRequest, request: Request) -> Response:
        """Vectors for a text, texts or token id lists, in the OpenAI shape."""
        if body.model in services:
            grpc_request = embed_request(body, pb, encoding=pb.VECTOR_ENCODING_PACKED_FLOAT32)
            call = services.embed(body.model, grpc_request, timeout_s)
        elif body.model in engines:
            call = engine_embed(engines, body.model, embed_request(body, engine_pb2), timeout_s)
        else:
            raise model_not_found(body.model)
        label_model(request, body.model)
        async with cancel_on_disconnect(request.receive):
            reply = await call
        content = json.dumps(embeddings_response(body, reply), separators=(",", ":"))
        return Response(content, media_type="application/json")

    return router
