"""Pooling strategies: token states -> one vector per input. One interface, one registry.

Names are those of sentence-transformers' ``Pooling`` module (``pooling_mode`` in
``1_Pooling/config.json``, or the legacy ``pooling_mode_*_tokens`` booleans). Several
modes concatenate in the order given. Inputs are right-padded: ``mask`` marks real tokens.
Sums accumulate in float32 whatever the compute dtype.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch


class PoolingStrategy(ABC):
    """``pool(hidden [B, S, H], mask [B, S] bool) -> [B, H]``."""

    name: str

    @abstractmethod
    def pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor: ...


class ClsPooling(PoolingStrategy):
    name = "cls"

    def pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return hidden[:, 0]


class LastTokenPooling(PoolingStrategy):
    name = "lasttoken"

    def pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        last = mask.sum(dim=1) - 1  # [B]: index of the last real token
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


class MaxPooling(PoolingStrategy):
    name = "max"

    def pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return hidden.masked_fill(~mask[..., None], float("-inf")).amax(dim=1)


class MeanPooling(PoolingStrategy):
    name = "mean"

    def _sum_count(self, hidden: torch.Tensor, mask: torch.Tensor):
        m = mask[..., None].to(hidden.dtype)  # [B, S, 1]
        total = (hidden * m).sum(dim=1, dtype=torch.float32)  # [B, H]
        count = mask.sum(dim=1, keepdim=True).to(torch.float32).clamp(min=1e-9)  # [B, 1]
        return total, count

    def pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        total, count = self._sum_count(hidden, mask)
        return (total / count).to(hidden.dtype)


class MeanSqrtLenPooling(MeanPooling):
    name = "mean_sqrt_len_tokens"

    def pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        total, count = self._sum_count(hidden, mask)
        return (total / count.sqrt()).to(hidden.dtype)


class WeightedMeanPooling(PoolingStrategy):
    """Position-weighted mean: token i (from 1) weighs i (SGPT-style)."""

    name = "weightedmean"

    def pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        s = hidden.shape[1]
        weights = torch.arange(1, s + 1, device=hidden.device, dtype=torch.float32)
        w = (mask.to(torch.float32) * weights)[..., None]  # [B, S, 1]
        total = (hidden.to(torch.float32) * w).sum(dim=1)
        return (total / w.sum(dim=1).clamp(min=1e-9)).to(hidden.dtype)


POOLING_STRATEGIES: dict[str, type[PoolingStrategy]] = {
    cls.name: cls
    for cls in (
        ClsPooling,
        MaxPooling,
        MeanPooling,
        MeanSqrtLenPooling,
        WeightedMeanPooling,
        LastTokenPooling,
    )
}

# sentence-transformers' legacy boolean keys, in its concatenation order.
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


class Pooling:
    """One or more strategies whose outputs are concatenated: ``[B, len(modes) * H]``."""

    def __init__(self, modes: Sequence[str]) -> None:
        unknown = [m for m in modes if m not in POOLING_STRATEGIES]
        if not modes or unknown:
            raise ValueError(
                f"unknown pooling mode(s) {unknown or list(modes)}; "
                f"known: {sorted(POOLING_STRATEGIES)}"
            )
        self.modes = tuple(modes)
        self._strategies = [POOLING_STRATEGIES[m]() for m in modes]

    @property
    def name(self) -> str:
        return "+".join(self.modes)

    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # hidden: [B, S, H]; mask: [B, S] bool -> [B, len(modes) * H]
        outs = [s.pool(hidden, mask) for s in self._strategies]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
