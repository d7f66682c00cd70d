"""Start the real embeddings service, and a gateway in front of it, as processes on free
loopback ports (the helpers of :mod:`stack`, for the embeddings stack).

The gateway serves embeddings alone (no ``JACANA_GATEWAY_ENGINES``), so no LLM is loaded
for embeddings tests, and it is ready when ``/health`` reports the embeddings service
serving.
"""

from __future__ import annotations

import json

from stack import Service, free_port, grpc_ready, http_ready, start_service

EMBEDDINGS_MODEL_ID = "all-minilm-l6-v2"


def start_embeddings(**env: str) -> Service:
    """``python -m jacana_embeddings`` (default model) on a free port; waits for SERVING."""
    port = free_port()
    return start_service(
        "jacana_embeddings",
        {"JACANA_EMBEDDINGS_HOST": "127.0.0.1", "JACANA_EMBEDDINGS_PORT": str(port), **env},
        f"127.0.0.1:{port}",
        grpc_ready,
    )


def start_embeddings_gateway(embeddings: dict[str, list[str]], **env: str) -> Service:
    """A gateway serving only ``embeddings`` (model -> endpoints); waits for /health 200."""
    port = free_port()
    return start_service(
        "jacana_gateway",
        {
            "JACANA_GATEWAY_HOST": "127.0.0.1",
            "JACANA_GATEWAY_PORT": str(port),
            "JACANA_GATEWAY_EMBEDDINGS": json.dumps(embeddings),
            **env,
        },
        f"127.0.0.1:{port}",
        http_ready,
    )
