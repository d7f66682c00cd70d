"""GET /v1/models and /v1/models/{model}: every served model, generation models first,
then embedding models, then speech-to-text models (404 ``model_not_found`` for one that
is not served here)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from jacana_gateway.errors import ERROR_RESPONSES, model_not_found
from jacana_gateway.state import GatewayState


def _model_card(state: GatewayState, model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": state.started_at, "owned_by": "jacana"}


def build_router(state: GatewayState) -> APIRouter:
    """The model list of ``state``, as OpenAI's ``/v1/models``."""
    router = APIRouter(prefix="/v1", tags=["openai"])

    @router.get("/models", responses=ERROR_RESPONSES)
    async def list_models() -> dict[str, Any]:
        """The served models: generation models, then embedding models, then
        speech-to-text models."""
        return {"object": "list", "data": [_model_card(state, m) for m in state.models]}

    @router.get("/models/{model:path}", responses=ERROR_RESPONSES)
    async def get_model(model: str) -> dict[str, Any]:
        """One served model; 404 if it is not served here."""
        if state.route_for(model) is None:
            raise model_not_found(model)
        return _model_card(state, model)

    return router
