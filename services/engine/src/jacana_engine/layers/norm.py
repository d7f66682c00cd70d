"""RMS normalization, computed in float32 and cast back, in the same order as HF."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``y = weight * (x / sqrt(mean(x²) + eps))`` over the last dimension.

    The statistics and the scaling run in float32; the result is cast back to the input
    dtype *before* the multiplication by ``weight`` (HF Llama/Qwen order), so bf16 results
    round exactly like the reference.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., dim]
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)
