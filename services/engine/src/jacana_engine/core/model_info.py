"""What clients learn about the served model (``GetModelInfo``); built once by the engine."""

from __future__ import annotations

from dataclasses import dataclass

from jacana_engine.pooling.methods import PoolingSpec


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the served model, for clients (``GetModelInfo``)."""

    model_id: str
    architecture: str
    max_model_len: int
    vocab_size: int
    dtype: str
    device: str
    eos_token_ids: tuple[int, ...]
    has_chat_template: bool
    pooling: PoolingSpec | None = None  # set when the engine serves embeddings
    hidden_size: int = 0  # the length of an embedding

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None
