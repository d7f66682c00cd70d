#!/usr/bin/env python3
"""Container health probe: exit 0 when the local service is healthy, 1 otherwise.

jacana-healthcheck engine      gRPC health of 127.0.0.1:$JACANA_ENGINE_PORT (default 50051)
jacana-healthcheck embeddings  gRPC health of 127.0.0.1:$JACANA_EMBEDDINGS_PORT (default 50061)
jacana-healthcheck drafter     gRPC health of 127.0.0.1:$JACANA_DRAFTER_PORT (default 50071)
jacana-healthcheck asr         gRPC health of 127.0.0.1:$JACANA_ASR_PORT (default 50081)
jacana-healthcheck multimodal  gRPC health of 127.0.0.1:$JACANA_MULTIMODAL_PORT (default 50091)
jacana-healthcheck render      the render worker on this host answers Celery's ping
jacana-healthcheck gateway     HTTP GET http://127.0.0.1:$JACANA_GATEWAY_PORT/health (8000)
jacana-healthcheck grpc HOST:PORT | http URL
"""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.request


def grpc_ok(target: str) -> bool:
    from jacana_common.grpc_client import check_health

    return asyncio.run(check_health(target, timeout=3.0))


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3.0) as resp:
            return resp.status == 200
    except OSError:
        return False


def render_ok() -> bool:
    """This host's render worker (named ``render@<hostname>``) answers a broadcast ping."""
    import socket

    from jacana_multimodal.worker import app

    replies = app.control.ping(destination=[f"render@{socket.gethostname()}"], timeout=3.0)
    return bool(replies)


def main(argv: list[str]) -> int:
    match argv:
        case ["engine"]:
            ok = grpc_ok(f"127.0.0.1:{os.environ.get('JACANA_ENGINE_PORT', '50051')}")
        case ["embeddings"]:
            ok = grpc_ok(f"127.0.0.1:{os.environ.get('JACANA_EMBEDDINGS_PORT', '50061')}")
        case ["drafter"]:
            ok = grpc_ok(f"127.0.0.1:{os.environ.get('JACANA_DRAFTER_PORT', '50071')}")
        case ["asr"]:
            ok = grpc_ok(f"127.0.0.1:{os.environ.get('JACANA_ASR_PORT', '50081')}")
        case ["multimodal"]:
            ok = grpc_ok(f"127.0.0.1:{os.environ.get('JACANA_MULTIMODAL_PORT', '50091')}")
        case ["render"]:
            ok = render_ok()
        case ["gateway"]:
            ok = http_ok(f"http://127.0.0.1:{os.environ.get('JACANA_GATEWAY_PORT', '8000')}/health")
        case ["grpc", target]:
            ok = grpc_ok(target)
        case ["http", url]:
            ok = http_ok(url)
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
