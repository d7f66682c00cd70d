"""Skinny GEMM for decode-sized linear layers: ``x @ weight.T`` with M <= 16 rows of x.

Who owns what: ``config`` (launch parameters and the rule of thumb), ``candidates`` (what
the tuner times), one module per kernel — ``tile`` (any M, plain or gated x; tl.dot or a
broadcast multiply), ``folded`` (one row, K folded into registers), ``activating`` (the
folded product of a gate_up weight, stored as ``silu(gate) * up``) — and ``jit`` (the
loads and the folded loop they share). ``skinny_linear`` checks its inputs once and
sends a launch to the kernel its config names. Everything is on the device and never
syncs with the host, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from jacana_engine.kernels._common import check_last_dim_contiguous
from jacana_engine.kernels.skinny_gemm.activating import activating_linear
from jacana_engine.kernels.skinny_gemm.candidates import candidate_configs
from jacana_engine.kernels.skinny_gemm.config import (
    DOT_MIN_M,
    DTYPES,
    FOLD,
    MAX_M,
    TARGET_PROGRAMS,
    SkinnyConfig,
    can_use,
    pick_config,
)
from jacana_engine.kernels.skinny_gemm.folded import folded_linear
from jacana_engine.kernels.skinny_gemm.tile import tile_linear

__all__ = [
    "DOT_MIN_M",
    "FOLD",
    "MAX_M",
    "TARGET_PROGRAMS",
    "SkinnyConfig",
    "can_use",
    "candidate_configs",
    "pick_config",
    "skinny_linear",
]


def skinny_linear(
    x: torch.Tensor,  # [M, K] ([M, 2K] gate then up when gated), M <= MAX_M
    weight: torch.Tensor,  # [N, K], unit stride on K
    out: torch.Tensor | None = None,  # [M, N] in x's dtype ([M, N / 2] activating)
    *,
    config: SkinnyConfig | None = None,  # launch parameters; pick_config's by default
    gated: bool = False,  # x is a gated MLP's gate_up: multiply by silu(gate) * up
) -> torch.Tensor:  # [M, N] in x's dtype ([M, N / 2] where ``config.activates``)
    """``x @ weight.T`` accumulated in float32, rounded once to x's dtype; with ``gated``,
    ``silu_and_mul(x) @ weight.T``, the activation computed as the weight streams in and
    rounded as ``kernels.activation.silu_and_mul`` rounds it (the same bits as that
    kernel followed by this one, one launch fewer); with a ``config`` that ``activates``
    (one row), weight is a gated MLP's gate then up and the output ``silu(gate) * up`` of
    the product's halves, [M, N / 2]. Raises ``ValueError`` for M > MAX_M, mismatched
    shapes or dtypes, a non-unit last stride, or a config its kernel cannot run."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"x and weight must be 2-D, got {x.dim()}-D and {weight.dim()}-D")
    m, width = x.shape
    k = width // 2 if gated else width
    n = weight.shape[0]
    activates = config is not None and config.activates
    if activates and (gated or config.k_fold == 1):
        raise ValueError("an activating launch takes a folded config of whole pairs, no gated x")
    n_out = n // 2 if activates else n
    if m > MAX_M:
        raise ValueError(f"skinny_linear takes at most {MAX_M} rows, got {m}")
    if weight.shape[1] != k or (gated and width != 2 * k):
        raise ValueError(f"weight {tuple(weight.shape)} does not match x's width {width}")
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"dtypes x={x.dtype} weight={weight.dtype}: want one of {DTYPES}")
    check_last_dim_contiguous("x", x)
    check_last_dim_contiguous("weight", weight)
    if out is None:
        out = torch.empty(m, n_out, dtype=x.dtype, device=x.device)
    elif out.shape != (m, n_out) or out.dtype != x.dtype:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} != ({m}, {n_out}) {x.dtype}")
    check_last_dim_contiguous("out", out)
    if m == 0 or n == 0:
        return out
    cfg = config or pick_config(m, n, k)
    if activates:
        return activating_linear(x, weight, out, cfg)
    if cfg.k_fold > 1:
        return folded_linear(x, weight, out, cfg, gated)
    return tile_linear(x, weight, out, cfg, gated)
