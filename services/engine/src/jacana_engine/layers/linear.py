"""The model's dense layers: ``Linear`` runs through a chosen GEMM backend, and
``MergedLinear`` stores several output projections as one matrix.

Backend: ``jacana_common.linear_backends`` (``torch``: ``F.linear``; ``onednn``: oneDNN's
linear, on CPU 1.5-2x faster than MKL's for the 1-8 rows of decode and verification
steps). The loader picks one per model (:func:`use_linear_backend`); every layer and the
logits projection use it.

Q, K and V (or gate and up) are separate tensors in a checkpoint but one GEMM at run time;
``MergedLinear`` keeps the row range of each named shard so a loader can copy a
checkpoint tensor straight into its slice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from jacana_common.linear_backends import LinearBackend, TorchLinear

if TYPE_CHECKING:  # the kernel module imports Triton; Linear must not need it
    from jacana_engine.kernels.skinny_gemm import SkinnyConfig


class Linear(nn.Linear):
    """``nn.Linear`` whose product runs on ``self.gemm`` (x: [T, in] -> [T, out]), or on
    the skinny decode kernel for the row counts T in ``skinny_configs``, with that row
    count's launch config (set on CUDA by ``decode_gemm.tune_decode_gemms``, empty
    elsewhere)."""

    gemm: LinearBackend = TorchLinear()
    # read-only defaults (instances get their own dict), so no layer mutates a shared one
    skinny_configs: Mapping[int, SkinnyConfig] = MappingProxyType({})
    # its input is a gated MLP's gate then up, [T, 2 * in] (``gated_forward``; set by the
    # model), so the tuner times the skinny kernel with the activation folded in
    gated_input = False
    # its rows are a gated MLP's gate then up (set by the model), so a one-row launch may
    # activate them as it stores (``SkinnyConfig.activates``, an in-graph search choice):
    # its output is then ``silu(gate) * up`` [T, out / 2], which the down projection's
    # gated entry points take as it is
    gated_output = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        config = self.skinny_configs.get(x.shape[0])
        if config is not None:
            return self.skinny_forward(x, config)
        return self.backend_forward(x)

    def backend_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm.linear(x, self.weight, self.bias)

    def skinny_forward(
        self, x: torch.Tensor, config: SkinnyConfig | None = None, *, gated: bool = False
    ) -> torch.Tensor:
        """The product on the skinny kernel, launched with ``config`` (by default the one
        tuned for x's row count, else the kernel's ``pick_config``); with ``gated``, x is
        [T, 2 * in], gate then up, multiplied as ``silu(gate) * up``."""
        return self._on_skinny(x, config or self.skinny_configs.get(x.shape[0]), gated=gated)

    def gated_forward(
        self,
        gate_up: torch.Tensor,  # [T, 2 * in]: a gated MLP's gate, then up
        silu_and_mul: Callable[[torch.Tensor], torch.Tensor],  # [T, 2 * in] -> [T, in]
    ) -> torch.Tensor:  # [T, out]
        """The product with ``silu(gate) * up``. Where T rows run on the skinny kernel the
        activation is folded into its loads (one launch fewer, the same bits as the
        Triton ``silu_and_mul`` followed by the kernel); elsewhere ``silu_and_mul`` runs
        first. A ``gate_up`` of ``in`` columns is activated already (``gated_output``)."""
        config = self.skinny_configs.get(gate_up.shape[0])
        if config is None:
            return self.backend_forward(
                gate_up if self._activated(gate_up) else silu_and_mul(gate_up)
            )
        return self._on_skinny(gate_up, config, gated=True)

    def _activated(self, x: torch.Tensor) -> bool:
        """x, given as a gated input, is the activation already: its producer's launch
        activated gate and up as it stored them (``SkinnyConfig.activates``)."""
        return x.shape[-1] == self.in_features

    def _on_skinny(
        self, x: torch.Tensor, config: SkinnyConfig | None, **kernel_args: Any
    ) -> torch.Tensor:  # [T, out]
        """``skinny_linear`` of x (its ``gated`` in ``kernel_args``, dropped where x is
        activated already) with this layer's weight, plus its bias."""
        from jacana_engine.kernels.skinny_gemm import skinny_linear

        if kernel_args.get("gated") and self._activated(x):
            kernel_args["gated"] = False
        y = skinny_linear(x.contiguous(), self.weight, config=config, **kernel_args)
        return y if self.bias is None else y.add_(self.bias)


def use_linear_backend(model: nn.Module, backend: LinearBackend) -> None:
    """Point every :class:`Linear` of ``model`` (and its logits projection) at ``backend``."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.gemm = backend
    if hasattr(model, "logits_gemm"):
        model.logits_gemm = backend


class MergedLinear(Linear):
    """``nn.Linear`` whose output rows are the concatenation of named shards.

    shard_sizes: output width of each shard, in storage order (e.g. q, k, v).
    """

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias=bias)
        self.shard_sizes = dict(shard_sizes)
        self.shard_offsets: dict[str, int] = {}
        offset = 0
        for name, size in self.shard_sizes.items():
            self.shard_offsets[name] = offset
            offset += size

    def load_shard(self, shard: str, param_name: str, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` (one checkpoint weight or bias) into shard ``shard`` of the param."""
        if shard not in self.shard_sizes:
            raise KeyError(f"unknown shard {shard!r}; shards are {list(self.shard_sizes)}")
        param = getattr(self, param_name)
        if param is None:
            raise KeyError(f"this layer has no {param_name!r}")
        start, size = self.shard_offsets[shard], self.shard_sizes[shard]
        target = param.data[start : start + size]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"shard {shard!r} {param_name}: checkpoint shape {tuple(tensor.shape)}, "
                f"expected {tuple(target.shape)}"
            )
        target.copy_(tensor)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """y: [..., sum(shards)] -> one view per shard, in storage order."""
        return y.split(list(self.shard_sizes.values()), dim=-1)
