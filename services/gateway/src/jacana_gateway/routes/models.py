"""GET /v1/models and /v1/models/{model}: every served model, generation models first,
then embedding models, then speech-to-text models, then video models (404
``model_not_found`` for one that is not served here).

A video model's entry carries two extensions from its service's model card
(``ListModels``, cached by :class:`jacana_gateway.backends.videos.VideoBackends`):
``random_weights`` (its frames are noise, a stand-in for real weights) and
``description``. While the service cannot be asked, the model is listed without them.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from jacana_gateway.errors import ERROR_RESPONSES, model_not_found
from jacana_gateway.state import GatewayState

# How long /v1/models waits for a multimodal service's model cards.
CARDS_TIMEOUT_S = 2.0


def _model_card(state: GatewayState, model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": state.started_at, "owned_by": "jacana"}


async def _model_cards(state: GatewayState, models: list[str]) -> list[dict[str, Any]]:
    """The cards of ``models``, video models with their service's extensions."""
    video_cards = {}
    if any(m in state.videos for m in models):
        video_cards = await state.videos.model_cards(CARDS_TIMEOUT_S)
    shown = []
    for model in models:
        card = _model_card(state, model)
        if (video := video_cards.get(model)) is not None:
            card |= {"random_weights": video.random_weights, "description": video.description}
        shown.append(card)
    return shown


def build_router(state: GatewayState) -> APIRouter:
    """The model list of ``state``, as OpenAI's ``/v1/models``."""
    router = APIRouter(prefix="/v1", tags=["openai"])

    @router.get("/models", responses=ERROR_RESPONSES)
    async def list_models() -> dict[str, Any]:
        """The served models: generation models, then embedding models, then
        speech-to-text models, then video models."""
        return {"object": "list", "data": await _model_cards(state, state.models)}

    @router.get("/models/{model:path}", responses=ERROR_RESPONSES)
    async def get_model(model: str) -> dict[str, Any]:
        """One served model; 404 if it is not served here."""
        if state.route_for(model) is None:
            raise model_not_found(model)
        return (await _model_cards(state, [model]))[0]

    return router
