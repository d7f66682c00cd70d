"""The gated SiLU feed-forward block of Llama/Qwen (``down(silu(gate(x)) * up(x))``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jacana_engine.layers.linear import MergedLinear


class GatedMLP(nn.Module):
    """SwiGLU MLP with gate and up projections fused into one GEMM."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(
            hidden_size, {"gate": intermediate_size, "up": intermediate_size}, bias=False
        )
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden] -> gate, up: [T, intermediate]
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj(F.silu(gate) * up)
