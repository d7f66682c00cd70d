"""The ``Embed`` call behind /v1/embeddings, on the embeddings services
(``jacana.embeddings.v1.Embeddings``) and on engines that pool.

Both stubs have ``Embed`` and take requests whose fields are named alike. Embedding is
idempotent, so a replica that answers UNAVAILABLE is skipped for the next one. An engine
that is not configured to pool (``JACANA_ENGINE_POOLING``) answers FAILED_PRECONDITION,
shown as a 400 ``model_not_supported`` naming ``model``.
"""

from __future__ import annotations

from typing import Any

from jacana_common.errors import ApiError
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2 as pb
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2_grpc
from jacana_common.pb.jacana.engine.v1 import engine_pb2
from jacana_gateway.backends.replica_pool import ReplicaPool, ServiceBackends, call_with_failover

EMBEDDINGS_SERVICE = "jacana.embeddings.v1.Embeddings"


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


async def engine_embed(
    engines: ReplicaPool, model: str, request: engine_pb2.EmbedRequest, timeout: float
) -> engine_pb2.EmbedResponse:
    """``Embed`` on an engine replica of ``model``; an engine that does not pool is a 400
    ``model_not_supported``."""
    try:
        return await call_embed(engines, model, request, timeout)
    except ApiError as exc:
        if exc.status == 400 and exc.param == "model":  # an engine that does not pool
            exc.code = "model_not_supported"
        raise
