"""``bench/layer_stream.py``, the probe's persistent layer kernel (one launch from o_proj to
the next qkv at batch 1), against the chain of torch references it replaces, so the
probe's timings are of a kernel that computes the layer.

On the CPU interpreter the grid is one program (the barrier cannot wait there) and the
check runs in float32, where every rounding step is a no-op and the only difference is
the order of the float32 sums (1e-5 relative). On CUDA it runs one program per SM in
bfloat16 against the engine's separate kernels on the same inputs: the GEMV sums run in
another order, so a product may round to its bf16 neighbour and the difference carries
through the norms; the bound is 2e-2 of the largest output, and the scratch is poisoned
with NaN first, so a program that read a vector before the barrier made it whole shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "bench"))

from layer_stream import StreamConfig, layer_stream

from jacana_engine.kernels.reference import (
    fused_add_rms_norm_reference,
    silu_and_mul_reference,
    skinny_linear_ref,
)

EPS = 1e-6


def _reference(attn, res, wo, wgu, wd, wqkv, g_post, g_next):
    o = skinny_linear_ref(attn, wo)
    normed, h1 = fused_add_rms_norm_reference(o, res, g_post, EPS)
    act = silu_and_mul_reference(skinny_linear_ref(normed, wgu))
    normed2, h2 = fused_add_rms_norm_reference(skinny_linear_ref(act, wd), h1, g_next, EPS)
    return skinny_linear_ref(normed2, wqkv), h2


def _inputs(h, inter, qkv, dtype, device):
    def rand(*shape):
        return (torch.randn(*shape, device=device) * shape[-1] ** -0.5).to(dtype)

    def gain():
        return (1 + 0.1 * torch.randn(h, device=device)).to(dtype)

    return (
        rand(1, h),
        rand(1, h),
        rand(h, h),
        rand(2 * inter, h),
        rand(h, inter),
        rand(qkv, h),
        gain(),
        gain(),
    )


def _run(inputs, config, dtype, device):
    attn, res, wo, wgu, wd, wqkv, g_post, g_next = inputs
    h, inter, qkv = attn.shape[1], wd.shape[1], wqkv.shape[0]

    def nan(width):
        return torch.full((1, width), float("nan"), dtype=dtype, device=device)

    res_out, qkv_out = nan(h), nan(qkv)
    layer_stream(
        attn, res, wo, wgu, wd, wqkv, g_post, g_next, EPS, EPS, residual_out=res_out,
        qkv_out=qkv_out, scratch=(nan(h), nan(2 * inter), nan(h)), config=config,
        pdl=device.type == "cuda",
    )  # fmt: skip
    return qkv_out, res_out


def _rel(out, ref):
    return float((out.double() - ref.double()).abs().max() / ref.double().abs().max())


@pytest.mark.parametrize("h,inter,qkv", [(64, 128, 96), (32, 96, 48), (32, 32, 64)])
@pytest.mark.parametrize("block_n", [1, 2, 4])
@pytest.mark.parametrize("interleave", [False, True])
def test_matches_the_reference_chain(device, seed, h, inter, qkv, block_n, interleave):
    dtype = torch.float32
    inputs = _inputs(h, inter, qkv, dtype, device)
    config = StreamConfig(block_n=block_n, stages=3, num_warps=4, interleave=interleave)
    qkv_out, res_out = _run(inputs, config, dtype, device)
    ref_qkv, ref_res = _reference(*inputs)
    assert _rel(qkv_out, ref_qkv) < 1e-5, f"seed {seed}"
    assert _rel(res_out, ref_res) < 1e-5, f"seed {seed}"


def test_refuses_what_it_cannot_run(device):
    inputs = list(_inputs(32, 32, 64, torch.float32, device))
    with pytest.raises(ValueError, match="1-3 times"):
        bad = inputs.copy()
        bad[3] = torch.zeros(2 * 40, 32, device=device)
        bad[4] = torch.zeros(32, 40, device=device)
        _run(bad, StreamConfig(), torch.float32, device)
    with pytest.raises(ValueError, match="multiple of block_n"):
        bad = inputs.copy()
        bad[5] = torch.zeros(66, 32, device=device)
        _run(bad, StreamConfig(block_n=4), torch.float32, device)
    with pytest.raises(ValueError, match="alias"):
        attn, res, *weights = inputs
        layer_stream(
            attn, res, *weights, EPS, EPS, residual_out=res, qkv_out=torch.zeros(1, 64),
            scratch=(torch.zeros(1, 32), torch.zeros(1, 64), torch.zeros(1, 32)),
        )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [
        StreamConfig(),
        StreamConfig(block_n=4, stages=4),
        StreamConfig(interleave=True),
        StreamConfig(l2_ahead=6),
    ],
)
def test_qwen3_8b_layer_matches_the_separate_kernels(gpu, device, seed, config):
    from jacana_engine.kernels.rmsnorm import fused_add_rms_norm
    from jacana_engine.kernels.skinny_gemm import skinny_linear

    dtype = torch.bfloat16
    inputs = _inputs(4096, 12288, 6144, dtype, device)
    attn, res, wo, wgu, wd, wqkv, g_post, g_next = inputs
    normed, h1 = fused_add_rms_norm(skinny_linear(attn, wo), res, g_post, EPS)
    down = skinny_linear(skinny_linear(normed, wgu), wd, gated=True)
    normed2, h2 = fused_add_rms_norm(down, h1, g_next, EPS)
    ref_qkv = skinny_linear(normed2, wqkv)
    runs = [_run(inputs, config, dtype, device) for _ in range(3)]
    qkv_out, res_out = runs[0]
    assert torch.isfinite(qkv_out).all() and torch.isfinite(res_out).all(), f"seed {seed}"
    assert _rel(qkv_out, ref_qkv) < 2e-2, f"seed {seed}"
    assert _rel(res_out, h2) < 2e-2, f"seed {seed}"
    # the barrier counter resets: three launches in a row give the same bits
    for q, r in runs[1:]:
        assert torch.equal(q, qkv_out) and torch.equal(r, res_out), f"seed {seed}"
