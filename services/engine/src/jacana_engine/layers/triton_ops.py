"""``LayerOps`` through the fused Triton kernels (the CUDA path).

RoPE reads a float32 cos/sin table indexed by position, built once per model on its
device with HF's float32 angles (``RotaryEmbedding.cos_sin_cache``); building it lazily
on the first forward keeps it out of any CUDA-graph capture (the runner warms up first).
``rotate_and_store`` is the same rope launch with the paged-cache store folded in.
"""

from __future__ import annotations

import torch

from jacana_engine.layers.ops import LayerOps
from jacana_engine.layers.rotary import RotaryEmbedding


class TritonOps(LayerOps):
    name = "triton"
    fuses_kv_store = True

    def __init__(self) -> None:
        from jacana_engine.kernels import activation, rmsnorm, rope

        self._rms_norm = rmsnorm.rms_norm
        self._fused_add_rms_norm = rmsnorm.fused_add_rms_norm
        self._silu_and_mul = activation.silu_and_mul
        self._rope = rope.rope
        self._qk_norm_rope = rope.qk_norm_rope
        self._kv_store = rope.KVStore

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._rms_norm(x, weight, eps, pdl=self.dependent_launch)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # In place: x's buffer takes the normed rows, residual's the sum (both are the
        # layer's own temporaries).
        return self._fused_add_rms_norm(
            x, residual, weight, eps, out=x, residual_out=residual, pdl=self.dependent_launch
        )

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        return self._silu_and_mul(x, pdl=self.dependent_launch)

    def rope_tables(
        self, rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return positions, rotary.cos_sin_cache()  # [T], [max_positions, head_dim] float32

    def rotate(self, q, k, tables, q_norm, k_norm, eps):
        return self._rotate(q, k, tables, q_norm, k_norm, eps, None)

    def rotate_and_store(self, q, k, v, tables, q_norm, k_norm, eps, kv_cache, slot_mapping):
        store = self._kv_store(v, kv_cache, slot_mapping)
        return self._rotate(q, k, tables, q_norm, k_norm, eps, store)

    def decode_rotation(self, k, v, tables, q_norm, k_norm, eps, slot_mapping):
        from jacana_engine.kernels.decode_rotation import DecodeRotation

        positions, cache = tables
        return DecodeRotation(k, v, positions, cache, slot_mapping, q_norm, k_norm, eps)

    def _rotate(self, q, k, tables, q_norm, k_norm, eps, store):
        positions, cache = tables  # [T], [max_positions, rotary_dim] float32
        if q_norm is not None:
            return self._qk_norm_rope(
                positions, q, k, q_norm, k_norm, eps, cache, store=store, pdl=self.dependent_launch
            )
        return self._rope(positions, q, k, cache, store=store, pdl=self.dependent_launch)
