"""The HTTP routes, one module per route family, all built the same way: each exposes
``build_router(state: GatewayState) -> APIRouter``, whose handlers check the request
(:mod:`jacana_gateway.schemas`), translate it (:mod:`jacana_gateway.translate`), call a
backend (:mod:`jacana_gateway.backends`) and shape the answer; failures are
:mod:`jacana_gateway.errors`'.

- :mod:`.generation`: /v1/chat/completions, /v1/completions (JSON or SSE);
- :mod:`.models`: /v1/models, /v1/models/{model};
- :mod:`.ops`: /health, /version, /metrics (never authenticated);
- :mod:`.embeddings`: /v1/embeddings;
- :mod:`.audio`: /v1/audio/transcriptions, /v1/audio/translations;
- :mod:`.audio_jobs`: /v1/audio/transcriptions/jobs (long audio as a job);
- :mod:`.videos`: /v1/videos and the routes below it.
"""

from __future__ import annotations

from jacana_gateway.routes import (
    audio,
    audio_jobs,
    embeddings,
    generation,
    models,
    ops,
    videos,
)

# In the order the app includes them (and the OpenAPI document lists them).
ROUTE_FAMILIES = (generation, models, ops, embeddings, audio, audio_jobs, videos)
