"""Start the real embeddings service, and a gateway in front of it, as processes on free
loopback ports (the helpers of :mod:`stack`, for the embeddings stack).

The gateway needs an engine endpoint in its settings; these tests give it a dead one and
wait for ``/version`` instead of ``/health`` (which reports the engines), so no LLM is
loaded for embeddings tests.
"""

from __future__ import annotations

import json

import httpx

from stack import Service, free_port, grpc_ready, start_service

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


def _version_ready(address: str) -> bool:
    try:
        return httpx.get(f"http://{address}/version", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def start_embeddings_gateway(embeddings: dict[str, list[str]], **env: str) -> Service:
    """A gateway serving ``embeddings`` (model -> endpoints); its engine address is dead."""
    port = free_port()
    return start_service(
        "jacana_gateway",
        {
            "JACANA_GATEWAY_HOST": "127.0.0.1",
            "JACANA_GATEWAY_PORT": str(port),
            "JACANA_GATEWAY_ENGINES": json.dumps({"no-llm": [f"127.0.0.1:{free_port()}"]}),
            "JACANA_GATEWAY_EMBEDDINGS": json.dumps(embeddings),
            **env,
        },
        f"127.0.0.1:{port}",
        _version_ready,
    )
