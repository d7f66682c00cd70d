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

import torch
from torch import nn

from jacana_common.linear_backends import LinearBackend, TorchLinear


class Linear(nn.Linear):
    """``nn.Linear`` whose product runs on ``self.gemm`` (x: [T, in] -> [T, out]), or on
    the skinny decode kernel for the row counts T in ``skinny_rows`` (set on CUDA by
    ``decode_gemm.tune_decode_gemms``, empty elsewhere)."""

    gemm: LinearBackend = TorchLinear()
    skinny_rows: frozenset[int] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] in self.skinny_rows:
            return self.skinny_forward(x)
        return self.backend_forward(x)

    def backend_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm.linear(x, self.weight, self.bias)

    def skinny_forward(self, x: torch.Tensor) -> torch.Tensor:
        from jacana_engine.kernels.skinny_gemm import skinny_linear

        y = skinny_linear(x.contiguous(), self.weight)  # [T, out]
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
