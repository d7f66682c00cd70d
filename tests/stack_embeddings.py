"""Start the real embeddings service, and a gateway in front of it, as processes on free
loopback ports (the helpers of :mod:`stack`, for the embeddings stack).

The gateway serves embeddings alone (no ``JACANA_GATEWAY_ENGINES``), so no LLM is loaded
for embeddings tests, and it is ready when ``/health`` reports the embeddings service
serving.
"""

from __future__ import annotations

from stack import Service, start_grpc_service, start_service_gateway

EMBEDDINGS_MODEL_ID = "all-minilm-l6-v2"


def start_embeddings(**env: str) -> Service:
    """``python -m jacana_embeddings`` (default model) on a free port; waits for SERVING."""
    return start_grpc_service("jacana_embeddings", "JACANA_EMBEDDINGS_", **env)


def start_embeddings_gateway(embeddings: dict[str, list[str]], **env: str) -> Service:
    """A gateway serving only ``embeddings`` (model -> endpoints); waits for /health 200."""
    return start_service_gateway("EMBEDDINGS", embeddings, **env)
