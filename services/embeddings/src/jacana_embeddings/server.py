"""gRPC front of the embeddings service: proto messages <-> :class:`EmbeddingService`.

Owns no state beyond a reference to the service. Errors become status codes with the
blamed field in the details (``jacana_common.errors.grpc_details``), which the gateway
turns into OpenAI-shaped HTTP errors.
"""

from __future__ import annotations

import logging

import grpc
import numpy as np

from jacana_common.errors import grpc_details
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2, embeddings_pb2_grpc
from jacana_embeddings.errors import (
    EmbeddingsError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
)
from jacana_embeddings.service import EmbeddingService, EmbedResult

log = logging.getLogger(__name__)

_STATUS = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFoundError: grpc.StatusCode.NOT_FOUND,
    OverloadedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def encode_response(
    result: EmbedResult, model_id: str, encoding: int
) -> embeddings_pb2.EmbedResponse:
    """Vectors -> EmbedResponse, packed little-endian float32 or repeated float."""
    packed = encoding == embeddings_pb2.VECTOR_ENCODING_PACKED_FLOAT32
    vectors = np.ascontiguousarray(result.vectors, dtype="<f4")  # [N, D]
    items = []
    for row, n, cut in zip(vectors, result.num_tokens, result.truncated, strict=True):
        item = embeddings_pb2.Embedding(num_tokens=n, truncated=cut)
        if packed:
            item.packed = row.tobytes()
        else:
            item.values.extend(row.tolist())
        items.append(item)
    tokens = result.prompt_tokens
    return embeddings_pb2.EmbedResponse(
        embeddings=items,
        dimension=result.dimension,
        usage=embeddings_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens),
        model_id=model_id,
    )


class EmbeddingsServicer(embeddings_pb2_grpc.EmbeddingsServicer):
    """Implements ``jacana.embeddings.v1.Embeddings`` over one :class:`EmbeddingService`."""

    def __init__(self, service: EmbeddingService) -> None:
        self.service = service

    async def Embed(self, request, context):
        kind = request.WhichOneof("input")
        texts = list(request.texts.texts) if kind == "texts" else None
        token_ids = [list(t.ids) for t in request.token_ids.inputs] if kind == "token_ids" else None
        if kind is None:
            texts = []  # reported as "input must not be empty"
        try:
            result = await self.service.embed(
                texts=texts,
                token_ids=token_ids,
                truncate=request.truncate,
                dimensions=request.dimensions if request.HasField("dimensions") else None,
                model=request.model,
            )
        except EmbeddingsError as exc:
            await context.abort(_STATUS[type(exc)], grpc_details(exc.message, exc.param))
        return encode_response(result, self.service.info.model_id, request.encoding)

    async def GetModelInfo(self, request, context):
        i = self.service.info
        return embeddings_pb2.ModelInfo(
            model_id=i.model_id,
            architecture=i.architecture,
            max_input_tokens=i.max_input_tokens,
            dimension=i.dimension,
            supports_matryoshka=i.supports_matryoshka,
            matryoshka_dimensions=list(i.matryoshka_dims),
            normalized=i.normalized,
            pooling=i.pooling,
            vocab_size=i.vocab_size,
            dtype=i.dtype,
            device=i.device,
            max_inputs_per_request=self.service.max_inputs,
        )

    async def GetStats(self, request, context):
        s = self.service.batcher.stats()
        return embeddings_pb2.EmbeddingsStats(
            queued_inputs=s.queued_inputs,
            requests_total=s.requests_total,
            inputs_total=s.inputs_total,
            batches_total=s.batches_total,
            tokens_total=s.tokens_total,
            padded_tokens_total=s.padded_tokens_total,
        )
