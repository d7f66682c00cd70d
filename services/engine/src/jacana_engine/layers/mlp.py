"""The gated SiLU feed-forward block of Llama/Qwen (``down(silu(gate(x)) * up(x))``)."""

from __future__ import annotations

import torch
from torch import nn

from jacana_engine.layers.linear import Linear, MergedLinear
from jacana_engine.layers.ops import LayerOps, TorchOps


class GatedMLP(nn.Module):
    """SwiGLU MLP with gate and up projections fused into one GEMM."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, ops: LayerOps | None = None
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(
            hidden_size, {"gate": intermediate_size, "up": intermediate_size}, bias=False
        )
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)
        self.down_proj.gated_input = True  # it runs through ``gated_forward`` (``down``)
        self.gate_up_proj.gated_output = True  # a one-row launch may activate as it stores
        self.ops = ops or TorchOps()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden] -> gate_up: [T, 2 * intermediate] -> [T, intermediate] -> [T, hidden]
        # (gate_up_proj's output is [T, intermediate] where its launch activates)
        return self.down(self.gate_up_proj(x))

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2 * intermediate] (gate_up_proj's output; [T, intermediate] where its
        launch activated it already) -> [T, hidden]."""
        return self.down_proj.gated_forward(gate_up, self.ops.silu_and_mul)
