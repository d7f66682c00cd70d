"""The attention-backend interface and its registry.

A backend turns one layer's projected, rotated Q/K/V into attention output over the paged
KV cache, writing this step's K/V into the cache first, unless told (``kv_written``) that
the rotary kernel already stored them there (``LayerOps.rotate_and_store``). Backends are
stateless and shared by all layers of a model. The registry maps a name to an import path,
so a GPU backend (Triton) is imported only when chosen.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any

import torch

from jacana_engine.worker.attention_metadata import AttentionMetadata


class AttentionBackend(ABC):
    """Paged causal attention for a flattened batch (prefill chunks and decodes mixed)."""

    name: str
    # True when ``forward`` reads only device tensors and host bounds from the metadata
    # (no per-sequence Python loop, no host sync), so a decode step can be captured in a
    # CUDA graph and replayed with new contents in the same buffers.
    graph_safe: bool = False
    # True when ``forward`` honours ``kv_written=True``: the cache is the plain layout
    # above, which ``LayerOps.rotate_and_store`` may fill. Backends that keep their own
    # layout or quantize on write leave it False and always get ``kv_written=False``.
    accepts_written_kv: bool = False
    # Launch the decode kernel with programmatic dependent launch (``kernels/_pdl.py``);
    # set by the model runner before capture. Backends without such a kernel ignore it.
    dependent_launch: bool = False
    # Fold the rotation of decode steps into the attention launch where the backend can
    # (``rotates_decode``); set by the model runner. Backends that cannot ignore it.
    fold_rope: bool = False
    # Decode adds a short sequence in one pass as cuDNN's attention does, where the
    # backend follows cuDNN's numerics (``EngineConfig.exact_decode_attention``); set by
    # the model runner. Backends without split-K decode ignore it.
    exact_decode: bool = False

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, n_heads, head_dim]
        k: torch.Tensor,  # [T, n_kv_heads, head_dim]
        v: torch.Tensor,  # [T, n_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        kv_written: bool = False,
        rotation: Any = None,
    ) -> torch.Tensor:  # [T, n_heads, head_dim] in q's dtype
        """Store k/v at ``meta.slot_mapping`` (skipped when ``kv_written``: they are already
        there, and k/v may go unread), then attend each sequence's queries causally. With a
        ``rotation`` (``LayerOps.decode_rotation``; only where ``rotates_decode`` said yes)
        q and k are not yet rotated: the launch rotates them, stores k/v, then attends."""

    def rotates_decode(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        """Whether ``forward`` takes a ``rotation`` for this step (never, by default)."""
        return False


# name -> "module:attribute" of an AttentionBackend subclass
_BACKENDS: dict[str, str] = {
    "torch": "jacana_engine.layers.paged_attention:TorchAttentionBackend",
    "triton": "jacana_engine.layers.triton_attention:TritonAttentionBackend",
}


def register_attention_backend(name: str, target: str) -> None:
    """Add a backend under ``name``; ``target`` is "module:ClassName"."""
    if ":" not in target:
        raise ValueError(f"attention backend target must be 'module:ClassName', got {target!r}")
    _BACKENDS[name] = target


def attention_backends() -> list[str]:
    """Names of the registered backends."""
    return sorted(_BACKENDS)


def resolve_attention_backend(name: str, device: torch.device | str) -> str:
    """The concrete backend for a setting: ``"auto"`` is "triton" on CUDA, "torch" elsewhere."""
    if name != "auto":
        return name
    return "triton" if torch.device(device).type == "cuda" else "torch"


def get_attention_backend(name: str) -> AttentionBackend:
    """A new instance of backend ``name``; ``ValueError`` names the choices if unknown."""
    target = _BACKENDS.get(name)
    if target is None:
        raise ValueError(f"unknown attention backend {name!r}; choose from {attention_backends()}")
    module_name, attr = target.split(":", 1)
    cls = getattr(importlib.import_module(module_name), attr)
    return cls()
