"""Elementwise/normalization ops of the decoder behind one interface and a registry.

A model is built with one ``LayerOps``; its modules keep a reference and call it in
``forward`` (no device checks in the hot path). ``"torch"`` is the reference and the CPU
path; ``"triton"`` (``layers/triton_ops.py``) runs the fused kernels of
``jacana_engine.kernels`` and is imported only when chosen. Both round like HF's modules,
so bf16 outputs agree with transformers.

Rotary embedding is two calls: ``rope_tables`` once per forward (per-step state, e.g.
cos/sin for these positions) and ``rotate`` in every layer (q/k norm folded in).
``rotate_and_store`` also stores the step's K/V into the layer's paged cache; ops whose
``fuses_kv_store`` is set do that in the rotary launch itself (one kernel launch less per
layer, which is what a batch-1 decode step is made of), the others rotate, then write.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.nn.functional as F

from jacana_engine.layers.paged_attention import write_kv_cache
from jacana_engine.layers.rotary import RotaryEmbedding, apply_rotary


class LayerOps(ABC):
    """One implementation of the decoder's non-GEMM ops."""

    name: str
    # True when ``rotate_and_store`` writes the cache in the same kernel as the rotation;
    # only then is it worth calling instead of the attention backend's own write.
    fuses_kv_store: bool = False
    # Launch the kernels with programmatic dependent launch (``kernels/_pdl.py``); set by
    # the model runner before capture. Ops without such kernels ignore it.
    dependent_launch: bool = False

    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x: [T, d] -> [T, d]; ``weight * (x / rms(x))``, rounded like HF."""

    @abstractmethod
    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed, new_residual) with ``new_residual = x + residual`` in x's dtype."""

    @abstractmethod
    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2 * I] (gate then up) -> [T, I] ``silu(gate) * up``."""

    @abstractmethod
    def rope_tables(
        self, rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype
    ) -> Any:
        """Per-step rotary state for ``positions`` [T], handed to every layer's ``rotate``."""

    @abstractmethod
    def rotate(
        self,
        q: torch.Tensor,  # [T, n_heads, head_dim]
        k: torch.Tensor,  # [T, n_kv, head_dim]
        tables: Any,
        q_norm: torch.Tensor | None,  # [head_dim] per-head RMSNorm weight (Qwen3) or None
        k_norm: torch.Tensor | None,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Optional per-head RMSNorm of q and k, then RoPE; may work in place."""

    def rotate_and_store(
        self,
        q: torch.Tensor,  # [T, n_heads, head_dim]
        k: torch.Tensor,  # [T, n_kv, head_dim]
        v: torch.Tensor,  # [T, n_kv, head_dim], stored as is
        tables: Any,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
        eps: float,
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
        slot_mapping: torch.Tensor,  # [T] int64; < 0 = padding token, stores nothing
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``rotate``, then store the rotated k and v at ``slot_mapping`` (cast to the
        cache's dtype), as the attention backend's write would. This default rotates,
        then writes with torch (it drops padding slots with a host sync: not for CUDA
        graphs); ``fuses_kv_store`` ops do both in one launch."""
        q, k = self.rotate(q, k, tables, q_norm, k_norm, eps)
        keep = slot_mapping >= 0
        if bool(keep.all()):
            write_kv_cache(kv_cache, k, v, slot_mapping)
        else:
            write_kv_cache(kv_cache, k[keep], v[keep], slot_mapping[keep])
        return q, k

    def decode_rotation(
        self,
        k: torch.Tensor,  # [T, n_kv, head_dim], not yet normed or rotated
        v: torch.Tensor,  # [T, n_kv, head_dim]
        tables: Any,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
        eps: float,
        slot_mapping: torch.Tensor,  # [T] int64
    ) -> Any:
        """What an attention backend needs to do ``rotate_and_store`` inside its own decode
        launch (``AttentionBackend.forward(rotation=...)``), or None where these ops cannot
        hand it over (the default)."""
        return None


class TorchOps(LayerOps):
    """Plain torch, the same arithmetic as the HF modules."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(x.dtype)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = x + residual
        return self.rms_norm(residual, weight, eps), residual

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def rope_tables(
        self, rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary(positions, dtype)  # cos, sin: [T, head_dim]

    def rotate(self, q, k, tables, q_norm, k_norm, eps):
        cos, sin = tables
        if q_norm is not None:
            q = self.rms_norm(q, q_norm, eps)
            k = self.rms_norm(k, k_norm, eps)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


# name -> "module:attribute" of a LayerOps subclass
_OPS: dict[str, str] = {
    "torch": "jacana_engine.layers.ops:TorchOps",
    "triton": "jacana_engine.layers.triton_ops:TritonOps",
}


def register_layer_ops(name: str, target: str) -> None:
    """Add an implementation under ``name``; ``target`` is "module:ClassName"."""
    if ":" not in target:
        raise ValueError(f"layer ops target must be 'module:ClassName', got {target!r}")
    _OPS[name] = target


def layer_ops_names() -> list[str]:
    return sorted(_OPS)


def get_layer_ops(name: str) -> LayerOps:
    """A new instance of ops ``name``; ``ValueError`` names the choices if unknown."""
    target = _OPS.get(name)
    if target is None:
        raise ValueError(f"unknown layer ops {name!r}; choose from {layer_ops_names()}")
    module_name, attr = target.split(":", 1)
    return getattr(importlib.import_module(module_name), attr)()


def layer_ops_for_backend(attention_backend: str) -> str:
    """The ops that go with an attention backend: its namesake if registered, else torch."""
    return attention_backend if attention_backend in _OPS else "torch"
