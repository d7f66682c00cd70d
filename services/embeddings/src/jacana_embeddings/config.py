"""Boundary dataclasses between the service's settings and its model/batching code."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EmbedderConfig:
    """What to load and how to run it.

    The ``None`` fields defer to the model directory: ``max_input_tokens`` to its
    sentence-transformers ``max_seq_length`` (capped by the position table), ``pooling``
    to ``1_Pooling/config.json``, ``normalize`` to a trailing ``Normalize`` module,
    ``matryoshka_dims`` to the model card. An empty ``matryoshka_dims`` turns it off.
    ``linear_backend`` names the dense-layer backend (``auto``, ``torch``, ``onednn``; see
    :mod:`jacana_common.linear_backends`). ``graph_tokens`` > 0 runs batches in padded
    grids of up to that many cells (rows x padded length), captured as CUDA graphs on a
    GPU (:mod:`jacana_embeddings.encoder_graphs`); 0 runs every batch packed, eagerly.
    """

    model_dir: Path
    model_id: str
    dtype: str = "float32"
    device: str = "cpu"
    linear_backend: str = "auto"
    max_input_tokens: int | None = None
    pooling: tuple[str, ...] | None = None
    normalize: bool | None = None
    matryoshka_dims: tuple[int, ...] | None = None
    graph_tokens: int = 0


@dataclass(frozen=True)
class BatcherConfig:
    """Dynamic batching limits.

    ``max_batch_tokens`` bounds one forward pass in real tokens (batches run packed);
    ``max_wait_ms`` is how long an idle batcher holds the first arrival for company;
    ``max_queued_inputs`` bounds inputs waiting (beyond it new requests are refused);
    ``batches_in_flight`` forward passes may run at once, each on its own worker thread
    (on a GPU a second one is launched while the first runs, so the device does not
    idle while the host prepares the next batch and hands back the last one's vectors).
    """

    max_batch_tokens: int = 2048
    max_batch_size: int = 256
    max_wait_ms: float = 2.0
    max_queued_inputs: int = 65536
    batches_in_flight: int = 1


def default_tokenizer_processes(on_cuda: bool, cores: int | None = None) -> int:
    """Tokenizer worker processes when the setting is unset: on a CUDA host with 8 or more
    cores one per 4 cores, up to 4 (the model thread launches faster once tokenizing
    leaves its interpreter); else none."""
    cores = (os.cpu_count() or 1) if cores is None else cores
    return min(4, cores // 4) if on_cuda and cores >= 8 else 0
