"""SiLU-and-mul, the gated MLP activation of Llama/Qwen: ``silu(gate) * up``.

Rounds like HF (silu rounded to the activation dtype before the product); compiled
without floating-point contraction so that no rounding step is fused away.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._common import check_last_dim_contiguous
from jacana_engine.kernels._pdl import pdl_launch, wait_for_previous_kernel

_BLOCK = 1024


@triton.jit
def silu_mul_rounded(gate, up, dtype: tl.constexpr):
    """``silu(gate) * up`` of float32 blocks, rounded as HF rounds it in ``dtype``: silu
    rounded before the product, the product rounded again (returned in ``dtype``). The
    skinny GEMM's gated loads use it too, so both give the same bits."""
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (act * up).to(dtype)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    stride_x,
    stride_o,
    inter,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    wait_for_previous_kernel(PDL)
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    product = silu_mul_rounded(gate, up, out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + cols, product, mask=mask)


def silu_and_mul(
    x: torch.Tensor, *, out: torch.Tensor | None = None, pdl: bool = False
) -> torch.Tensor:
    """x: [T, 2 * I] (gate then up) -> [T, I] in x's dtype (or into ``out`` [T, I]); ``pdl``
    launches with programmatic dependent launch (``kernels/_pdl.py``)."""
    num_tokens, width = x.shape
    if width % 2:
        raise ValueError(f"silu_and_mul needs an even last dimension, got {width}")
    check_last_dim_contiguous("x", x)
    inter = width // 2
    if out is None:
        out = torch.empty(num_tokens, inter, dtype=x.dtype, device=x.device)
    elif out.shape != (num_tokens, inter):
        raise ValueError(f"out {tuple(out.shape)} != ({num_tokens}, {inter})")
    check_last_dim_contiguous("out", out)
    if num_tokens == 0:
        return out
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(inter, _BLOCK))](
        x,
        out,
        x.stride(0),
        out.stride(0),
        inter,
        BLOCK=_BLOCK,
        num_warps=4,
        enable_fp_fusion=False,
        **pdl_launch(pdl, x.device),
    )
    return out
