"""RMS normalization, computed in float32 and cast back, in the same order as HF."""

from __future__ import annotations

import torch
from torch import nn

from jacana_engine.layers.linear import Linear
from jacana_engine.layers.ops import LayerOps, TorchOps


class RMSNorm(nn.Module):
    """``y = weight * (x / sqrt(mean(x²) + eps))`` over the last dimension.

    The statistics and the scaling run in float32; the result is cast back to the input
    dtype *before* the multiplication by ``weight`` (HF Llama/Qwen order), so bf16 results
    round exactly like the reference. ``ops`` picks the implementation once, at build time.
    """

    def __init__(self, dim: int, eps: float, ops: LayerOps | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.ops = ops or TorchOps()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, dim] -> [T, dim]
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual), both [T, dim]; may reuse the inputs' buffers."""
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)

    def then(
        self, linear: Linear, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(linear(norm(x + residual)), x + residual)``; without a residual
        ``(linear(norm(x)), x)``."""
        if residual is None:
            return linear(self(x)), x
        h, residual = self.add_forward(x, residual)
        return linear(h), residual

    def between(
        self,
        producer: Linear,
        x: torch.Tensor,  # [T, producer.in] ([T, 2 * in] with ``gated``)
        residual: torch.Tensor,  # [T, dim]
        consumer: Linear | None,
        *,
        gated: bool = False,  # x is a gated MLP's gate_up (producer.gated_forward)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(consumer(norm(producer(x) + residual)), producer(x) + residual)``; without a
        consumer the normed rows themselves. With ``gated`` the producer folds the
        activation into its skinny launch where it runs x's row count there
        (``Linear.gated_forward``)."""
        y = producer.gated_forward(x, self.ops.silu_and_mul) if gated else producer(x)
        if consumer is None:
            return self.add_forward(y, residual)
        return self.then(consumer, y, residual)
