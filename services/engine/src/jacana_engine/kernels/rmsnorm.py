"""RMSNorm and fused residual-add + RMSNorm, one program per token row.

Rounding follows HF's Llama/Qwen modules so bf16 outputs match them: the residual sum is
rounded to the activation dtype, statistics run in float32, the normalized row is
rounded before the weight multiply, and the product is rounded again. The mean of
squares is added in the order torch's CUDA ``mean`` adds it (``_row_sum_order``), which
depends on the launch's row count, so transformers' norm on the GPU and ours agree bit
for bit. Compiled without floating-point contraction so that no rounding step is fused
away.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from jacana_engine.kernels._common import check_last_dim_contiguous, next_power_of_2
from jacana_engine.kernels._pdl import pdl_launch, wait_for_previous_kernel
from jacana_engine.kernels._row_sum_order import (
    row_sum_of_squares,
    torch_row_sum_order,
    unfused,
)


@triton.jit
def rms_scale(x, rstd, w, dtype: tl.constexpr):
    """``w * (x * rstd)`` of float32 blocks, rounded as HF's RMSNorm rounds in ``dtype``:
    the normalized values before the weight multiply, the product again (returned in
    ``dtype``). Every kernel that normalizes (this one, RoPE's q/k norm, the skinny
    GEMM's folded norms) rounds through here, so they agree bit for bit."""
    return ((x * rstd).to(dtype).to(tl.float32) * w).to(dtype)


@triton.jit
def rms_norm_row(
    x,
    row_ptr,
    w,
    hidden,
    inv_hidden,
    eps,
    dtype: tl.constexpr,
    SUM_WIDTH: tl.constexpr,
    SUM_VECTOR: tl.constexpr,
    SUM_PASSES: tl.constexpr,
):
    """One row [BLOCK] float32, zeros past ``hidden``: ``w * rms_norm(x)`` in ``dtype``.
    ``row_ptr`` holds the same row (its statistics are read from there in torch's order,
    ``_row_sum_order``); ``inv_hidden`` is float32's 1 / hidden, as torch's mean scales."""
    sum_sq = row_sum_of_squares(row_ptr, hidden, SUM_WIDTH, SUM_VECTOR, SUM_PASSES)
    rstd = tl.rsqrt(unfused(sum_sq * inv_hidden) + eps)
    return rms_scale(x, rstd, w, dtype)


def row_norm_args(hidden: int, rows: int) -> tuple[float, dict]:
    """What ``rms_norm_row`` needs beyond its tensors in a launch of ``rows`` rows:
    float32's 1 / hidden, and the sum order's constexprs."""
    inv_hidden = float(np.float32(1.0) / np.float32(hidden))
    return inv_hidden, torch_row_sum_order(hidden, rows).constexprs()


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    hidden,
    inv_hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    SUM_WIDTH: tl.constexpr,
    SUM_VECTOR: tl.constexpr,
    SUM_PASSES: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    wait_for_previous_kernel(PDL)
    x_row = x_ptr + row * stride_x
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(residual_out_ptr.dtype.element_ty)
        x_row = residual_out_ptr + row * stride_ro
        tl.store(x_row + cols, summed, mask=mask)
        tl.debug_barrier()  # the statistics read the stored row back in another order
        x = summed.to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = rms_norm_row(
        x, x_row, w, hidden, inv_hidden, eps, out_ptr.dtype.element_ty,
        SUM_WIDTH, SUM_VECTOR, SUM_PASSES,
    )  # fmt: skip
    tl.store(out_ptr + row * stride_o + cols, out, mask=mask)


def _launch(x, residual, weight, eps, out, residual_out, pdl) -> None:
    num_tokens, hidden = x.shape
    if weight.shape != (hidden,):
        raise ValueError(f"weight {tuple(weight.shape)} does not match hidden size {hidden}")
    check_last_dim_contiguous("x", x)
    if num_tokens == 0:
        return
    block = next_power_of_2(hidden)
    inv_hidden, sum_order = row_norm_args(hidden, num_tokens)
    _rms_norm_kernel[(num_tokens,)](
        x,
        residual,
        weight,
        out,
        residual_out,
        x.stride(0),
        residual.stride(0),
        out.stride(0),
        residual_out.stride(0),
        hidden,
        inv_hidden,
        eps,
        HAS_RESIDUAL=residual is not x,
        BLOCK=block,
        num_warps=min(16, max(1, block // 512)),
        enable_fp_fusion=False,
        **sum_order,
        **pdl_launch(pdl, x.device),
    )


def rms_norm(
    x: torch.Tensor,  # [T, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    *,
    out: torch.Tensor | None = None,  # [T, hidden]; may be x itself
    pdl: bool = False,  # launch with programmatic dependent launch (kernels/_pdl.py)
) -> torch.Tensor:  # [T, hidden] in out's dtype (x's by default)
    """``weight * (x / sqrt(mean(x²) + eps))`` per row, HF rounding order."""
    out = torch.empty_like(x) if out is None else _checked_out("out", out, x)
    _launch(x, x, weight, eps, out, out, pdl)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,  # [T, hidden]
    residual: torch.Tensor,  # [T, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    *,
    out: torch.Tensor | None = None,  # [T, hidden]
    residual_out: torch.Tensor | None = None,  # [T, hidden]
    pdl: bool = False,  # launch with programmatic dependent launch (kernels/_pdl.py)
) -> tuple[torch.Tensor, torch.Tensor]:  # (normed, new_residual), both [T, hidden]
    """``new_residual = x + residual`` (rounded to x's dtype), ``normed =
    rms_norm(new_residual)``, in one pass. With ``out=x, residual_out=residual`` it runs
    in place; by default the inputs are left alone."""
    if residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} != x {tuple(x.shape)}")
    check_last_dim_contiguous("residual", residual)
    out = torch.empty_like(x) if out is None else _checked_out("out", out, x)
    new_residual = (
        torch.empty_like(x)
        if residual_out is None
        else _checked_out("residual_out", residual_out, x)
    )
    _launch(x, residual, weight, eps, out, new_residual, pdl)
    return out, new_residual


def _checked_out(name: str, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if out.shape != x.shape:
        raise ValueError(f"{name} {tuple(out.shape)} != x {tuple(x.shape)}")
    check_last_dim_contiguous(name, out)
    return out
