"""The activating kernel (``kernels/skinny_gemm/activating.py``): the bits of the plain
folded launch followed by ``silu_and_mul``, near the float64 activation, and the down
projection that takes its output."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels.activation import silu_and_mul
from jacana_engine.kernels.skinny_gemm import FOLD, SkinnyConfig, skinny_linear
from jacana_engine.kernels.skinny_gemm.activating import activating_linear_ref

# Activating launches: gate_up [2I, K] with I not a multiple of the tile's pairs, and
# K ragged; one launched dependently.
ACTIVATING_CASES = [
    (100, 2 * 37, SkinnyConfig(1, 2, 64, False, k_fold=FOLD, activates=True)),
    (
        200,
        2 * 45,
        SkinnyConfig(1, 8, 64, False, pdl=True, k_fold=FOLD, activates=True),
    ),
    (77, 2 * 40, SkinnyConfig(1, 16, 32, False, k_fold=FOLD, activates=True)),
]


@pytest.mark.parametrize("k,n,cfg", ACTIVATING_CASES)
def test_an_activating_launch_is_its_tile_then_silu_and_mul(device, seed, k, n, cfg):
    """``SkinnyConfig.activates``: the same bits as the plain launch of the same tile
    (gate and up rounded as stored) followed by the ``silu_and_mul`` kernel, [1, N / 2],
    and near the torch reference's float64 activation. Poisoned output: every column is
    written. float32 and, on the GPU, bfloat16 (the interpreter's float32 -> bfloat16
    conversions truncate, alike on both sides, but torch's reference would not)."""
    dtypes = [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]
    for dtype in dtypes:
        x = (3 * torch.randn(1, k, device=device)).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        plain = skinny_linear(x, w, config=dataclasses.replace(cfg, activates=False))
        want = silu_and_mul(plain)
        out = torch.full((1, n // 2), float("nan"), device=device, dtype=dtype)
        got = skinny_linear(x, w, out, config=cfg)
        assert got.shape == (1, n // 2)
        assert torch.equal(got, want), f"{dtype} {(k, n)} {cfg} seed={seed}"
        ref = activating_linear_ref(x, w).double()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert (got.double() - ref).abs().max() <= tol * ref.abs().max(), f"seed={seed}"


def test_an_activating_launch_rejects_what_it_cannot_run(device):
    x, w = torch.randn(1, 32, device=device), torch.randn(8, 32, device=device)
    activating = SkinnyConfig(1, 2, 32, False, k_fold=FOLD, activates=True)
    with pytest.raises(ValueError, match="pairs"):
        skinny_linear(x, w, config=dataclasses.replace(activating, k_fold=1))
    with pytest.raises(ValueError, match="pairs"):
        skinny_linear(x, w, config=dataclasses.replace(activating, block_n=1))
    with pytest.raises(ValueError, match="pairs"):
        skinny_linear(x, w[:7], config=activating)
    with pytest.raises(ValueError, match="gated"):
        skinny_linear(torch.randn(1, 64, device=device), w, config=activating, gated=True)
    with pytest.raises(ValueError, match=r"\(1, 4\)"):
        skinny_linear(x, w, torch.empty(1, 8, device=device), config=activating)


@pytest.mark.parametrize("down_runs", ["skinny", "cuBLAS"])
def test_an_activating_gate_up_feeds_the_down_projection_the_same_bits(device, seed, down_runs):
    """A gated MLP whose gate_up launch activates (``SkinnyConfig.activates``) at one row:
    its output is ``silu(gate) * up`` [1, I], and every gated entry point of the down
    projection (``gated_forward`` on the skinny kernel or cuBLAS) takes it as it is and
    gives the bits of the non-activating launch of the same tile followed by the gated
    path (float32)."""
    from jacana_engine.layers.mlp import GatedMLP
    from jacana_engine.layers.triton_ops import TritonOps

    hidden, inter = 48, 40
    mlp = GatedMLP(hidden, inter, TritonOps()).to(device).requires_grad_(False)
    for linear in (mlp.gate_up_proj, mlp.down_proj):
        linear.weight.normal_(0.0, hidden**-0.5)
    assert mlp.gate_up_proj.gated_output and not mlp.down_proj.gated_output
    activating = SkinnyConfig(1, 4, 32, False, k_fold=FOLD, activates=True)
    down = SkinnyConfig(1, 8, 32, False, k_fold=FOLD)
    if down_runs != "cuBLAS":
        mlp.down_proj.skinny_configs = {1: down}
    x = torch.randn(1, hidden, device=device)

    def run(gate_up_config):
        mlp.gate_up_proj.skinny_configs = {1: gate_up_config}
        gate_up = mlp.gate_up_proj(x)
        return gate_up, mlp.down(gate_up)

    act, got = run(activating)
    gate_up, want = run(dataclasses.replace(activating, activates=False))
    assert act.shape == (1, inter) and gate_up.shape == (1, 2 * inter)
    assert torch.equal(act, silu_and_mul(gate_up)), f"seed={seed}"
    assert torch.equal(got, want), f"{down_runs} seed={seed}"
