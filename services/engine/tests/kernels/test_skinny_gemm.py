"""skinny_linear against the float32-accumulated reference and float64 truth.

Tolerances, relative to the output's magnitude (``Checks.close``: L2 norm and max|diff|
over max|ref|): float32 within 1e-6 / 1e-5 of float64 (float32 sums of K <= 12288
products in another order); bfloat16 within 3e-3 / 4e-3 of float64 (one rounding of the
float32 sum to bfloat16, 2^-9 relative at worst), and at most 1% of the elements
differ from the reference rounded to bfloat16 (the float32 sums differ only in order, so
a flip needs a sum within float32 noise of a bfloat16 rounding boundary).

Under Triton's CPU interpreter (triton 3.9) ``tl.dot`` on bfloat16 operands returns
garbage, so bfloat16 runs on CPU take the ``tl.sum`` path (float32 covers both paths
there), and float32 -> bfloat16 stores truncate instead of rounding to nearest (within
2^-8 relative: there the tolerance is 6e-3 / 8e-3), so the 1% check runs on CUDA only.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels._common import next_power_of_2
from jacana_engine.kernels.activation import silu_and_mul
from jacana_engine.kernels.reference import skinny_linear_ref
from jacana_engine.kernels.rmsnorm import fused_add_rms_norm, rms_norm
from jacana_engine.kernels.skinny_gemm import (
    FOLD,
    MAX_M,
    QWEN3_SHAPES,
    NormPrologue,
    SkinnyConfig,
    candidate_configs,
    l2_prefetch_plan,
    pick_config,
    skinny_linear,
)

# One bf16 ulp of the largest output, relative to it. A bf16 output rounds each element by
# up to half an ulp, which is up to 2^-8 of the largest when that one sits just below a
# power of two, and the float32 sums add their own ordering error on top (a bound of 4e-3
# failed one run in four on an H200, at 4.98e-3).
ONE_ULP = 2**-7
TOL = {torch.float32: (1e-6, 1e-5), torch.bfloat16: (3e-3, ONE_ULP)}
TOL_BF16_TRUNCATED = (6e-3, 8e-3)  # the CPU interpreter truncates float32 -> bfloat16
SMALL = [(1, 64, 40), (3, 200, 96), (16, 200, 40), (5, 64, 96), (16, 64, 96)]
# candidate_configs' tiles: N not a multiple of BLOCK_N, K not a multiple of BLOCK_K
# (1100: 3 steps of 512, 2 of 1024, 1 masked one of 2048; 3000: whole rows of 4096 too)
CANDIDATE_SHAPES = [
    (1, 40, 64),
    (1, 1100, 72),
    (1, 600, 200),
    (1, 3000, 24),
    (5, 1100, 40),
    (16, 96, 64),
]


def _check(out, x, w, seed, checks, what) -> None:
    truth = x.double() @ w.double().T  # [M, N]
    rel_l2, max_rel = TOL[x.dtype]
    if x.dtype == torch.bfloat16 and out.device.type == "cpu":
        rel_l2, max_rel = TOL_BF16_TRUNCATED
    checks.close(out, truth, rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=what)
    if x.dtype != torch.float32 and out.device.type == "cuda":
        ref = skinny_linear_ref(x, w)
        checks.mostly_equal(out, ref, max_fraction=0.01, seed=seed, what=what)


@pytest.mark.parametrize("m,k,n", SMALL)
@pytest.mark.parametrize("use_dot", [None, False, True])
def test_skinny_linear_float32(device, seed, checks, m, k, n, use_dot):
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device)
    out = skinny_linear(x, w, config=pick_config(m, n, k, use_dot=use_dot))
    assert out.shape == (m, n) and out.dtype == torch.float32
    _check(out, x, w, seed, checks, f"float32 {m}x{k}x{n} dot={use_dot}")


@pytest.mark.parametrize("m,k,n", SMALL)
def test_skinny_linear_bfloat16(device, seed, checks, m, k, n):
    x = torch.randn(m, k, device=device).bfloat16()
    w = torch.randn(n, k, device=device).bfloat16()
    use_dot = None if device.type == "cuda" else False
    out = skinny_linear(x, w, config=pick_config(m, n, k, use_dot=use_dot))
    assert out.dtype == torch.bfloat16
    _check(out, x, w, seed, checks, f"bfloat16 {m}x{k}x{n}")


@pytest.mark.parametrize("use_dot", [False, True])
def test_skinny_linear_deterministic(device, seed, use_dot):
    m, k, n = 5, 200, 96
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device)
    cfg = pick_config(m, n, k, use_dot=use_dot)
    first = skinny_linear(x, w, config=cfg)
    second = skinny_linear(x, w, config=cfg)
    assert torch.equal(first, second), f"seed={seed}: two calls differ"


def test_skinny_linear_out_argument(device, seed, checks):
    m, k, n = 3, 64, 40
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device)
    out = torch.full((m, n), float("nan"), device=device)
    got = skinny_linear(x, w, out=out)
    assert got is out
    _check(out, x, w, seed, checks, "out=")


def test_skinny_linear_rejects(device):
    w = torch.randn(8, 32, device=device)
    with pytest.raises(ValueError, match="at most"):
        skinny_linear(torch.randn(MAX_M + 1, 32, device=device), w)
    with pytest.raises(ValueError):
        skinny_linear(torch.randn(2, 16, device=device), w)  # K mismatch
    with pytest.raises(ValueError):
        skinny_linear(torch.randn(2, 32, device=device).bfloat16(), w)  # dtype mismatch
    with pytest.raises(ValueError):
        skinny_linear(torch.randn(2, 32, device=device), w, out=torch.empty(2, 9, device=device))


def _gated_cases(device: torch.device):
    """(dtype, configs) to compare the gated kernel on: every candidate of the sum path,
    and on CUDA the dot path too (the CPU interpreter's bfloat16 ``tl.dot`` is broken)."""
    for dtype in (torch.float32, torch.bfloat16):
        for m, k, n in CANDIDATE_SHAPES:
            configs = candidate_configs(m, n, k)
            if device.type == "cuda" or dtype == torch.float32:
                configs.append(pick_config(m, n, k, use_dot=not configs[0].use_dot))
            yield (
                dtype,
                m,
                k,
                n,
                [
                    c
                    for c in configs
                    if device.type == "cuda" or not (c.use_dot and dtype == torch.bfloat16)
                ],
            )


# Under the CPU interpreter every program runs in Python, so the folded-norm tests run a
# rotating share of each case's candidates: the shape's own pick and two more, the next
# two for each case, so that over the cases every kind of candidate still runs (they took
# 110 s of ``make test`` over all candidates). On CUDA every candidate runs.
_INTERPRETED_SHARE = 3


def _share_of(configs: list, case: int, device: torch.device) -> list:
    """``configs``, or under the interpreter case ``case``'s rotating share of them."""
    if device.type == "cuda" or len(configs) <= _INTERPRETED_SHARE:
        return configs
    rest = configs[1:]
    more = _INTERPRETED_SHARE - 1
    turn = [rest[(case * more + j) % len(rest)] for j in range(more)]
    return [configs[0], *dict.fromkeys(turn)]


def test_gated_kernel_gives_the_bits_of_silu_and_mul_then_the_kernel(device, seed):
    for dtype, m, k, n, configs in _gated_cases(device):
        gate_up = (torch.randn(m, 2 * k, device=device) * 2).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        activated = silu_and_mul(gate_up)  # [m, k]
        for cfg in configs:
            fused = skinny_linear(gate_up, w, config=cfg, gated=True)
            plain = skinny_linear(activated, w, config=cfg)
            assert torch.equal(fused, plain), f"{dtype} {(m, k, n)} {cfg} seed={seed}"


def _plain_gated_and_normed(gate_up, w, nw, residual, cfg) -> dict[str, torch.Tensor]:
    """The three kinds of product of one config: x = gate_up's first half; gated; normed."""
    x = gate_up[:, : w.shape[1]].contiguous()
    norm = NormPrologue(nw, 1e-6, residual, torch.empty_like(residual))
    return {
        "plain": skinny_linear(x, w, config=cfg),
        "gated": skinny_linear(gate_up, w, config=cfg, gated=True),
        "norm": skinny_linear(x, w, config=cfg, norm=norm),
    }


_TWINS = (  # the ways a config may load its weights that must not change a sum
    dict(pdl=True),
    dict(pdl=True, prefetch_tiles=2),
    dict(lookahead=True),
    dict(pdl=True, lookahead=True),
    dict(pdl=True, prefetch_tiles=2, lookahead=True),
    dict(weight_eviction="evict_first"),
)


def test_pdl_and_eviction_configs_give_the_bits_of_the_plain_ones(device, seed):
    """``pdl`` loads the first weight tile or two before the rest (and on CUDA launches
    with PDL), ``weight_eviction`` only hints the cache; the sums are the same, so plain,
    gated and normalized products keep their bits. On CUDA every twin of every candidate;
    under the interpreter (which runs each program in Python: the whole product took 200 s
    of ``make test``) every twin of every shape and dtype, on the candidates in turn."""
    for dtype, m, k, n, configs in _gated_cases(device):
        gate_up = torch.randn(m, 2 * k, device=device).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        nw = torch.ones(k, device=device, dtype=dtype)
        residual = torch.randn(m, k, device=device).to(dtype)
        if device.type == "cuda":
            pairs = [(cfg, twin) for cfg in configs for twin in _TWINS]
        elif not configs:  # bfloat16 on the dot path only: not on the interpreter
            continue
        else:
            pairs = [(configs[i % len(configs)], twin) for i, twin in enumerate(_TWINS)]
        wanted = {}
        for cfg, twin in pairs:
            if cfg not in wanted:
                wanted[cfg] = _plain_gated_and_normed(gate_up, w, nw, residual, cfg)
            twin_cfg = dataclasses.replace(cfg, **twin)
            got = _plain_gated_and_normed(gate_up, w, nw, residual, twin_cfg)
            for kind, want in wanted[cfg].items():
                assert torch.equal(got[kind], want), f"{kind} {twin_cfg} seed={seed}"


def test_candidates_with_pdl_come_twice_and_one_row_ones_deeper_and_ahead(device):
    plain = candidate_configs(1, 4096, 4096)
    dependent = [dataclasses.replace(c, pdl=True) for c in plain]
    deeper = [dataclasses.replace(c, prefetch_tiles=2) for c in dependent if c.block_k < 2048]
    ahead = [dataclasses.replace(c, lookahead=True) for c in dependent if c.block_k < 4096]
    assert candidate_configs(1, 4096, 4096, pdl=True) == plain + dependent + deeper + ahead
    assert not any(c.pdl for c in plain) and deeper  # K=4096 holds 2+ tiles of 512, 1024
    # whole rows (one tile of K) have no loop to run ahead in
    assert {(c.block_n, c.block_k) for c in plain} >= {(1, 4096), (2, 4096)}
    assert ahead and not any(c.lookahead for c in dependent + deeper)
    plain = candidate_configs(4, 4096, 4096)
    assert candidate_configs(4, 4096, 4096, pdl=True) == plain + [
        dataclasses.replace(c, pdl=True) for c in plain
    ]


def test_folded_candidates_take_the_dependent_one_row_tiles_and_larger_ones():
    k, n = QWEN3_SHAPES["8B gate_up"]
    before = candidate_configs(1, n, k, pdl=True)
    folded = candidate_configs(1, n, k, pdl=True, folded=True)[len(before) :]
    assert candidate_configs(1, n, k, pdl=True, folded=True)[: len(before)] == before
    assert all(c.k_fold == FOLD and c.pdl and c.prefetch_tiles == 1 for c in folded)
    tiles = {(c.block_n, c.block_k) for c in folded}
    assert tiles >= {(c.block_n, c.block_k) for c in before if c.pdl}
    assert tiles >= {(16, 1024), (8, 2048)}  # twice the tile, in fewer registers
    assert len(set(folded)) == len(folded)
    # none without PDL, above one row, or on the dot path
    assert not any(c.k_fold > 1 for c in candidate_configs(1, n, k, folded=True))
    assert not any(c.k_fold > 1 for c in candidate_configs(2, n, k, pdl=True, folded=True))
    assert not any(c.k_fold > 1 for c in candidate_configs(16, n, k, pdl=True, folded=True))


def test_folded_candidates_take_each_peel_count_that_k_holds(monkeypatch):
    from jacana_engine.kernels import skinny_gemm

    k, n = QWEN3_SHAPES["8B qkv"]
    plain = candidate_configs(1, n, k, pdl=True)
    one = candidate_configs(1, n, k, pdl=True, folded=True)[len(plain) :]
    monkeypatch.setattr(skinny_gemm, "FOLDED_PEELS", (1, 2))
    both = candidate_configs(1, n, k, pdl=True, folded=True)[len(plain) :]
    assert [c for c in both if c.prefetch_tiles == 1] == one
    two = [c for c in both if c.prefetch_tiles == 2]
    # every one-tile candidate whose row holds two tiles, twice: 2x2048 then loads its rows
    want = [dataclasses.replace(c, prefetch_tiles=2) for c in one if 2 * c.block_k <= k]
    assert two == want and two
    assert any((c.block_n, c.block_k) == (2, 2048) for c in two)
    assert not any(c.block_k > k // 2 for c in two)  # a whole-row tile has no second
    assert len(set(both)) == len(both)


# (K, N, gated, dtype, BLOCK_N, BLOCK_K, PEEL tiles): ragged last rows and K step, more
# K steps than peeled tiles, a gated x, float32
FOLDED_CASES = [
    (200, 100, False, torch.bfloat16, 8, 64, 1),
    (96, 77, True, torch.bfloat16, 4, 32, 2),
    (1000, 40, False, torch.float32, 2, 256, 1),
    (72, 300, True, torch.float32, 16, 16, 2),
]


@pytest.mark.parametrize("k,n,gated,dtype,block_n,block_k,peel", FOLDED_CASES)
def test_folded_kernel_matches(device, seed, checks, k, n, gated, dtype, block_n, block_k, peel):
    """The folded kernel's product against float64 truth (its sums come in another order
    than the tile kernel's: close, not the same bits), run after run the same bits, with
    and without PDL; gated, against silu_and_mul's rounded activation."""
    x = torch.randn(1, 2 * k if gated else k, device=device).to(dtype)
    w = torch.randn(n, k, device=device).to(dtype)
    rows = silu_and_mul(x) if gated else x
    outs = []
    for pdl in (False, True):
        cfg = SkinnyConfig(1, block_n, block_k, False, pdl=pdl, prefetch_tiles=peel, k_fold=FOLD)
        out = torch.full((1, n), float("nan"), device=device, dtype=dtype)  # poisoned
        outs.append(skinny_linear(x, w, out, config=cfg, gated=gated))
        _check(out, rows, w, seed, checks, f"1x{k}x{n} {cfg}")
    assert torch.equal(outs[0], outs[1]), f"seed={seed}"


def test_folded_kernel_refuses_what_it_cannot_run(device):
    x, w = torch.randn(2, 32, device=device), torch.randn(64, 32, device=device)
    folded = SkinnyConfig(2, 8, 32, False, k_fold=FOLD)
    with pytest.raises(ValueError, match="one row"):
        skinny_linear(x, w, config=folded)
    with pytest.raises(ValueError, match="one row"):  # a fold that does not divide BLOCK_K
        skinny_linear(x[:1], w, config=dataclasses.replace(folded, block_m=1, k_fold=64))
    with pytest.raises(ValueError, match="k_fold"):
        one = dataclasses.replace(folded, block_m=1)
        skinny_linear(x[:1], w, config=one, norm=NormPrologue(torch.ones(32, device=device), 1e-6))
    for tile_kernel_only in ({"lookahead": True}, {"l2_prefetch_bytes": 2048}):
        with pytest.raises(ValueError, match="no lookahead and no L2 prefetch"):
            one = dataclasses.replace(folded, block_m=1, pdl=True, **tile_kernel_only)
            skinny_linear(x[:1], w, config=one)


def test_gated_kernel_rejects_a_gate_up_of_the_wrong_width(device):
    w = torch.randn(8, 32, device=device)
    with pytest.raises(ValueError, match="width"):
        skinny_linear(torch.randn(2, 32, device=device), w, gated=True)
    with pytest.raises(ValueError, match="width"):
        skinny_linear(torch.randn(2, 65, device=device), w, gated=True)


@pytest.mark.parametrize("tied", [False, True])
def test_logits_run_on_the_untied_heads_tuned_pick(device, seed, checks, tied, monkeypatch):
    """compute_logits goes through an untied lm_head as a Linear, so the tuner's one-row
    pick for it is what runs (it used to call the backend with the weight, so the pick
    was timed and never used); a tied head has no Linear and keeps the backend."""
    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.models.base import ModelConfig
    from jacana_engine.models.registry import build_model

    cfg = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=40, hidden_size=32, intermediate_size=48,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=64,
        tie_word_embeddings=tied,
    )  # fmt: skip
    model = build_model(cfg, device=device, dtype=torch.float32).requires_grad_(False)
    for param in model.parameters():
        param.copy_(torch.randn_like(param))
    if not tied:
        model.lm_head.skinny_configs = {1: pick_config(1, 40, 32)}
    calls = []
    real = skinny_gemm.skinny_linear
    monkeypatch.setattr(
        skinny_gemm, "skinny_linear", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw)
    )
    weight = model.model.embed_tokens.weight if tied else model.lm_head.weight
    for m in (1, 2):
        hidden = torch.randn(m, 32, device=device)
        got = model.compute_logits(hidden)
        assert got.dtype == torch.float32
        expected = torch.nn.functional.linear(hidden, weight)
        checks.close(got, expected, rel_l2=1e-5, max_rel=1e-4, seed=seed, what=f"m={m}")
    assert calls == ([] if tied else [1])  # one row on the pick, two on the backend


@pytest.mark.parametrize("tuned", [False, True])
def test_gated_forward_folds_the_activation_only_into_skinny_rows(
    device, seed, checks, tuned, monkeypatch
):
    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.layers.linear import Linear

    layer = Linear(48, 40, bias=True).to(device).requires_grad_(False)
    if tuned:
        layer.skinny_configs = {1: pick_config(1, 40, 48)}
    gated_calls, activations = [], []
    real = skinny_gemm.skinny_linear
    monkeypatch.setattr(
        skinny_gemm,
        "skinny_linear",
        lambda *a, **kw: gated_calls.append(kw.get("gated")) or real(*a, **kw),
    )

    def counted_silu_and_mul(x):
        activations.append(x.shape[0])
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    for m in (1, 2):
        gate_up = torch.randn(m, 96, device=device)
        gate, up = gate_up.chunk(2, dim=-1)
        expected = torch.nn.functional.linear(
            torch.nn.functional.silu(gate) * up, layer.weight, layer.bias
        )
        got = layer.gated_forward(gate_up, counted_silu_and_mul)
        checks.close(got, expected, rel_l2=1e-5, max_rel=1e-4, seed=seed, what=f"m={m}")
    # one row on the kernel with the activation folded in; two rows activate, then cuBLAS
    assert (gated_calls, activations) == (([True], [2]) if tuned else ([], [1, 2]))


@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_prologue_equals_rms_norm_then_the_kernel(device, seed, checks, with_residual):
    """Against the RMSNorm kernel followed by the same GEMM kernel (the unfused path): the
    normalized rows may round differently where the statistics' summation order moves a
    bf16 boundary, so within the bf16 tolerance; the residual sum is bit-exact."""
    for case, (dtype, m, k, n, configs) in enumerate(_gated_cases(device)):
        x = torch.randn(m, k, device=device).to(dtype)
        nw = (1 + 0.1 * torch.randn(k, device=device)).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        residual = torch.randn(m, k, device=device).to(dtype) if with_residual else None
        if with_residual:
            normed, summed = fused_add_rms_norm(x, residual, nw, 1e-6)
        else:
            normed, summed = rms_norm(x, nw, 1e-6), None
        for cfg in _share_of(configs, case, device):
            res_out = torch.full_like(x, float("nan")) if with_residual else None
            got = skinny_linear(x, w, config=cfg, norm=NormPrologue(nw, 1e-6, residual, res_out))
            want = skinny_linear(normed, w, config=cfg)
            rel_l2, max_rel = TOL[dtype]
            if dtype == torch.bfloat16 and device.type == "cpu":
                rel_l2, max_rel = TOL_BF16_TRUNCATED
            what = f"{dtype} {(m, k, n)} {cfg}"
            checks.close(got, want.float(), rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=what)
            if with_residual:
                assert torch.equal(res_out, summed), what


def test_a_deferred_norm_is_the_product_of_the_unrounded_norm(device, seed, checks):
    """``NormPrologue(deferred=True)``: the weight times x as it loads, 1/rms applied to the
    product. Against the float64 product of the unrounded normalized rows (what it
    computes, up to float32 sums), and within a bf16 ulp of the rounded path (the RMSNorm
    kernel, then the GEMM), which rounds the normalized rows twice."""
    for case, (dtype, m, k, n, configs) in enumerate(_gated_cases(device)):
        x = (3 * torch.randn(m, k, device=device)).to(dtype)
        nw = (1 + 0.1 * torch.randn(k, device=device)).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        xd = x.double()
        normed = xd * torch.rsqrt(xd.pow(2).mean(dim=1, keepdim=True) + 1e-6) * nw.double()
        exact = normed @ w.double().t()
        for cfg in _share_of(configs, case, device):
            rounded = skinny_linear(rms_norm(x, nw, 1e-6), w, config=cfg)
            out = torch.full((m, n), float("nan"), device=device, dtype=dtype)
            got = skinny_linear(x, w, out, config=cfg, norm=NormPrologue(nw, 1e-6, deferred=True))
            rel_l2, max_rel = TOL[dtype]
            if dtype == torch.bfloat16 and device.type == "cpu":
                rel_l2, max_rel = TOL_BF16_TRUNCATED
            what = f"{dtype} {(m, k, n)} {cfg}"
            checks.close(got, exact, rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=what)
            if dtype == torch.bfloat16:  # the roundings it skips: within about an ulp
                checks.close(got, rounded.float(), rel_l2=2 * rel_l2, max_rel=2 * max_rel,
                             seed=seed, what=f"{what} against the rounded path")  # fmt: skip


# One row, both kernels: the tile kernel's sum path and the folded one (k_fold), with
# tiles that leave N and K ragged.
ONE_ROW_CASES = [
    (200, 100, SkinnyConfig(1, 8, 64, False)),
    (200, 100, SkinnyConfig(1, 4, 64, False, pdl=True, prefetch_tiles=2, k_fold=FOLD)),
    (96, 77, SkinnyConfig(1, 16, 32, False, k_fold=FOLD)),
    (96, 77, SkinnyConfig(1, 2, 128, False, pdl=True)),
]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("k,n,cfg", ONE_ROW_CASES)
def test_then_residual_adds_the_residual_to_the_rounded_product(device, seed, k, n, cfg, gated):
    """``then_residual``: the product (the plain launch's bits) plus the residual, rounded
    as HF's residual add; in place into the residual too. float32 on the CPU interpreter,
    whose float32 -> bfloat16 conversions truncate where torch's round."""
    dtypes = [torch.float32] + ([torch.bfloat16] if device.type == "cuda" else [])
    for dtype in dtypes:
        x = torch.randn(1, 2 * k if gated else k, device=device).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        residual = torch.randn(1, n, device=device).to(dtype)
        product = skinny_linear(x, w, config=cfg, gated=gated)
        want = (product.float() + residual.float()).to(dtype)
        out = torch.full((1, n), float("nan"), device=device, dtype=dtype)
        got = skinny_linear(x, w, out, config=cfg, gated=gated, then_residual=residual)
        assert torch.equal(got, want), f"{dtype} {(k, n)} {cfg} seed={seed}"
        in_place = residual.clone()
        skinny_linear(x, w, in_place, config=cfg, gated=gated, then_residual=in_place)
        assert torch.equal(in_place, want), f"in place: {dtype} {(k, n)} {cfg} seed={seed}"


# Activating launches: gate_up [2I, K] with I not a multiple of the tile's pairs, and
# K ragged; one with two tiles before a dependent wait.
ACTIVATING_CASES = [
    (100, 2 * 37, SkinnyConfig(1, 2, 64, False, k_fold=FOLD, activates=True)),
    (
        200,
        2 * 45,
        SkinnyConfig(1, 8, 64, False, pdl=True, prefetch_tiles=2, k_fold=FOLD, activates=True),
    ),
    (77, 2 * 40, SkinnyConfig(1, 16, 32, False, k_fold=FOLD, activates=True)),
]


@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("k,n,cfg", ACTIVATING_CASES)
def test_an_activating_launch_is_its_tile_then_silu_and_mul(device, seed, k, n, cfg, deferred):
    """``SkinnyConfig.activates``: the same bits as the plain launch of the same tile
    (gate and up rounded as stored) followed by the ``silu_and_mul`` kernel, [1, N / 2];
    also with a deferred norm whose weight is in the GEMM's. Poisoned output: every
    column is written. float32 and, on the GPU, bfloat16 (the interpreter's float32 ->
    bfloat16 conversions truncate, alike on both sides, but torch's reference would not)."""
    dtypes = [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]
    for dtype in dtypes:
        x = (3 * torch.randn(1, k, device=device)).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        norm = NormPrologue(None, 1e-6, deferred=True) if deferred else None
        plain = skinny_linear(x, w, config=dataclasses.replace(cfg, activates=False), norm=norm)
        want = silu_and_mul(plain)
        out = torch.full((1, n // 2), float("nan"), device=device, dtype=dtype)
        got = skinny_linear(x, w, out, config=cfg, norm=norm)
        assert got.shape == (1, n // 2)
        assert torch.equal(got, want), f"{dtype} {(k, n)} {cfg} deferred={deferred} seed={seed}"
        gate, up = (x.double() @ w.double().t()).chunk(2, dim=1)
        if not deferred:  # and near the float64 activation (two roundings of its own)
            exact = gate * torch.sigmoid(gate) * up
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            assert (got.double() - exact).abs().max() <= tol * exact.abs().max(), f"seed={seed}"


def test_activating_candidates_are_the_folded_pairs_of_a_gate_up():
    n, k = 2 * 600, 200
    every = candidate_configs(1, n, k, pdl=True, folded=True, activating=True)
    activating = [c for c in every if c.activates]
    folded = [c for c in every if c.k_fold > 1 and not c.activates]
    assert activating == [
        dataclasses.replace(c, activates=True) for c in folded if c.block_n % 2 == 0
    ]
    assert activating and all(c.pdl and c.block_m == 1 for c in activating)
    plain = candidate_configs(1, n, k, pdl=True, folded=True)
    assert every[: len(every) - len(activating)] == plain
    for m, width in ((1, n + 1), (2, n)):  # an odd N, and more than one row: none
        others = candidate_configs(m, width, k, pdl=True, folded=True, activating=True)
        assert not any(c.activates for c in others)


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
    with pytest.raises(ValueError, match="residual"):
        skinny_linear(x, w, config=activating, then_residual=torch.randn(1, 4, device=device))
    with pytest.raises(ValueError, match=r"\(1, 4\)"):
        skinny_linear(x, w, torch.empty(1, 8, device=device), config=activating)


def test_norm_prologue_rejects_what_it_cannot_run(device):
    x, w = torch.randn(2, 32, device=device), torch.randn(8, 32, device=device)
    nw, r = torch.ones(32, device=device), torch.randn(2, 32, device=device)
    with pytest.raises(ValueError, match="norm weight"):
        skinny_linear(x, w, norm=NormPrologue(torch.ones(16, device=device), 1e-6))
    with pytest.raises(ValueError, match="come together"):
        skinny_linear(x, w, norm=NormPrologue(nw, 1e-6, residual=r))
    with pytest.raises(ValueError, match="storage"):
        skinny_linear(x, w, norm=NormPrologue(nw, 1e-6, residual=r, residual_out=r))
    with pytest.raises(ValueError, match="exclude"):
        skinny_linear(torch.randn(2, 64, device=device), w, gated=True, norm=NormPrologue(nw, 1e-6))
    with pytest.raises(ValueError, match="deferred"):
        res_out = torch.empty_like(r)
        skinny_linear(x, w, norm=NormPrologue(nw, 1e-6, r, res_out, deferred=True))


def test_pick_config_fills_the_gpu():
    for k, n in QWEN3_SHAPES.values():
        for m in (1, 2, 4, 8, 16):
            cfg = pick_config(m, n, k)
            assert cfg.block_m >= m and cfg.use_dot == (m >= 16)
            programs = cfg.grid(n)[0]
            assert programs >= 264 or cfg.block_n == (16 if cfg.use_dot else 8), (m, k, n, cfg)


@pytest.mark.parametrize("m,k,n", CANDIDATE_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_candidate_config_matches(device, seed, checks, m, k, n, dtype):
    configs = candidate_configs(m, n, k)
    if dtype == torch.bfloat16 and device.type == "cpu" and configs[0].use_dot:
        pytest.skip("the CPU interpreter's tl.dot is wrong on bfloat16 (module docstring)")
    x = torch.randn(m, k, device=device).to(dtype)
    w = torch.randn(n, k, device=device).to(dtype)
    for cfg in configs:
        _check(skinny_linear(x, w, config=cfg), x, w, seed, checks, f"{m}x{k}x{n} {cfg}")


def test_candidate_configs_rule():
    shapes = [(m, n, k) for k, n in QWEN3_SHAPES.values() for m in (1, 2, 3, 8, 16)]
    shapes += [(m, n, k) for m, k, n in CANDIDATE_SHAPES]
    for m, n, k in shapes:
        configs = candidate_configs(m, n, k)
        assert configs[0] == pick_config(m, n, k), (m, n, k)
        assert len(set(configs)) == len(configs), (m, n, k, configs)
        assert len(configs) <= (10 if m == 1 else 2), (m, n, k, configs)
        for cfg in configs:
            whole_row = cfg.block_k == next_power_of_2(k) > 2048
            assert cfg.block_k <= max(32, next_power_of_2(k)), (m, n, k, cfg)
            assert cfg.block_n >= (1 if whole_row else 2), (m, n, k, cfg)
            assert cfg.block_m >= m and cfg.use_dot == configs[0].use_dot
    # the sweep's winners at one row are among the candidates
    k, n = QWEN3_SHAPES["0.6B o"]
    assert {(c.block_n, c.block_k) for c in candidate_configs(1, n, k)} >= {(2, 2048), (4, 2048)}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(QWEN3_SHAPES))
def test_skinny_linear_qwen3_gpu(gpu, device, seed, checks, name):
    k, n = QWEN3_SHAPES[name]
    w = (torch.randn(n, k, device=device) * k**-0.5).bfloat16()
    for m in (1, 2, 4, 8, 16):
        x = torch.randn(m, k, device=device).bfloat16()
        out = skinny_linear(x, w)
        _check(out, x, w, seed, checks, f"{name} M={m}")
        assert torch.equal(out, skinny_linear(x, w)), f"{name} M={m} seed={seed}: not deterministic"


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(QWEN3_SHAPES))
def test_folded_kernel_at_qwen3_sizes_gpu(gpu, device, seed, checks, name):
    """Every folded one-row candidate (PDL, as the engine launches them) at each Qwen3
    shape, the down projections gated: against float64 truth, and its bits run after
    run."""
    k, n = QWEN3_SHAPES[name]
    gated = name.endswith("down")
    w = (torch.randn(n, k, device=device) * k**-0.5).bfloat16()
    x = torch.randn(1, 2 * k if gated else k, device=device).bfloat16()
    rows = silu_and_mul(x) if gated else x
    folded = [c for c in candidate_configs(1, n, k, pdl=True, folded=True) if c.k_fold > 1]
    assert folded, name
    for cfg in folded:
        out = torch.full((1, n), float("nan"), device=device, dtype=x.dtype)
        skinny_linear(x, w, out, config=cfg, gated=gated)
        _check(out, rows, w, seed, checks, f"{name} {cfg}")
        again = skinny_linear(x, w, config=cfg, gated=gated)
        assert torch.equal(again, out), f"{name} {cfg} seed={seed}: not deterministic"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["0.6B down", "8B down"])
def test_gated_kernel_gives_the_bits_of_silu_and_mul_at_qwen3_sizes_gpu(gpu, device, seed, name):
    k, n = QWEN3_SHAPES[name]
    w = (torch.randn(n, k, device=device) * k**-0.5).bfloat16()
    for m in (1, 2, 4, 8, 16):
        gate_up = (torch.randn(m, 2 * k, device=device) * 2).bfloat16()
        activated = silu_and_mul(gate_up)
        for cfg in candidate_configs(m, n, k):
            fused = skinny_linear(gate_up, w, config=cfg, gated=True)
            assert torch.equal(fused, skinny_linear(activated, w, config=cfg)), (m, cfg, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["8B o", "8B down"])
def test_pdl_launches_keep_the_bits_in_a_cuda_graph_gpu(gpu, device, seed, name):
    """A chain of PDL launches (each layer's output the next one's input) captured in a
    CUDA graph and replayed equals the same chain launched plainly and eagerly, with one
    or two tiles loaded before the wait and with or without 8 MiB of the weight (2 KB a
    row) prefetched to L2 (a hint: the same bits)."""
    k, n = QWEN3_SHAPES[name]
    weights = [(torch.randn(n, k, device=device) * k**-0.5).bfloat16() for _ in range(4)]
    variants = itertools.product(candidate_configs(1, n, k)[:2], (1, 2), (0, 8 << 20))
    for cfg, depth, l2_bytes in variants:
        twin = dataclasses.replace(cfg, pdl=True, prefetch_tiles=depth, l2_prefetch_bytes=l2_bytes)

        def chain(c, x):
            for w in weights:  # n == k for o; down's output is sliced back to k
                y = skinny_linear(x, w, config=c)
                x = torch.cat([y] * (k // n), dim=1) if k != n else y
            return y

        x = torch.randn(1, k, device=device).bfloat16()
        want = chain(cfg, x)
        static_x = x.clone()
        chain(twin, static_x)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = chain(twin, static_x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want), (name, cfg, seed)


@pytest.mark.gpu
def test_skinny_linear_cuda_graph(gpu, device, seed, checks):
    k, n = QWEN3_SHAPES["0.6B gate_up"]
    w = torch.randn(n, k, device=device).bfloat16()
    for m in (1, 16):
        x = torch.randn(m, k, device=device).bfloat16()
        out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
        skinny_linear(x, w, out=out)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            skinny_linear(x, w, out=out)
        for _ in range(2):
            x.copy_(torch.randn(m, k, device=device).bfloat16())
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            _check(out, x, w, seed, checks, f"graph replay M={m}")


@pytest.mark.parametrize("bias", [False, True])
def test_linear_sends_only_its_skinny_rows_to_the_kernel(device, seed, checks, bias, monkeypatch):
    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.layers.linear import Linear

    layer = Linear(48, 40, bias=bias).to(device).requires_grad_(False)
    configs = {1: candidate_configs(1, 40, 48)[-1], 3: pick_config(3, 40, 48)}
    layer.skinny_configs = configs
    assert set(layer.skinny_configs) == {1, 3}
    calls = []
    real = skinny_gemm.skinny_linear
    monkeypatch.setattr(
        skinny_gemm, "skinny_linear", lambda *a, **kw: calls.append(kw["config"]) or real(*a, **kw)
    )
    for m in (1, 2, 3):
        x = torch.randn(m, 48, device=device)
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        rel_l2, max_rel = TOL[torch.float32]
        checks.close(layer(x), expected, rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=f"m={m}")
    assert calls == [configs[1], configs[3]]  # rows 1 and 3 with their configs, not 2


class _FakeClock:
    """Stands in for ``decode_gemm._time``: runs the timed call once on the first layer
    (for real, small), notes what it launched, and returns ``price(event)`` for it, an
    event being ("cublas", rows, width), ("norm", rows), ("skinny", rows, config),
    ("gated", rows, config), ("folded", rows, config) or ("tail", rows, config)."""

    def __init__(self, monkeypatch, price) -> None:
        from jacana_engine.kernels import rmsnorm, skinny_gemm
        from jacana_engine.layers.linear import Linear

        self.price, self.events = price, []
        real_skinny, real_backend = skinny_gemm.skinny_linear, Linear.backend_forward
        real_norm = rmsnorm.fused_add_rms_norm

        def skinny(x, w, *a, **kw):
            if kw.get("then_norm") is not None:
                kind = "tail"
            elif kw.get("norm") is not None:
                kind = "folded"
            else:
                kind = "gated" if kw.get("gated") else "skinny"
            self.events.append((kind, x.shape[0], kw["config"]))
            return real_skinny(x, w, *a, **kw)

        def backend(layer, x):
            self.events.append(("cublas", x.shape[0], x.shape[1]))
            return real_backend(layer, x)

        def norm(x, *a, **kw):
            self.events.append(("norm", x.shape[0]))
            return real_norm(x, *a, **kw)

        monkeypatch.setattr(skinny_gemm, "skinny_linear", skinny)
        monkeypatch.setattr(Linear, "backend_forward", backend)
        monkeypatch.setattr(rmsnorm, "fused_add_rms_norm", norm)

    def __call__(self, layers, run) -> float:
        self.events.clear()
        run(layers[0])
        (event,) = self.events
        return self.price(event)


def test_tuner_stores_the_fastest_config_that_forward_uses(device, seed, checks, monkeypatch):
    """The plumbing, with a fake clock: at one row the last candidate is fastest and beats
    cuBLAS, at two rows every candidate loses to cuBLAS by less than the margin."""
    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning import decode_gemm

    k, n = 1100, 72
    fastest = candidate_configs(1, n, k)[-1]

    def price(event):
        if event[0] == "cublas":
            return 1.0
        return 0.95 if event[1] == 2 else 0.5 if event[2] == fastest else 0.8

    monkeypatch.setattr(decode_gemm, "_time", _FakeClock(monkeypatch, price))
    layers = [Linear(k, n, bias=True).to(device).requires_grad_(False) for _ in range(2)]
    assert decode_gemm._tune_shape(layers, [1, 2]) == {1: fastest}
    calls = []
    real = skinny_gemm.skinny_linear
    monkeypatch.setattr(
        skinny_gemm, "skinny_linear", lambda *a, **kw: calls.append(kw["config"]) or real(*a, **kw)
    )
    for layer in layers:
        assert dict(layer.skinny_configs) == {1: fastest}
        for m in (1, 2):
            x = torch.randn(m, k, device=device)
            expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
            rel_l2, max_rel = TOL[torch.float32]
            checks.close(
                layer(x), expected, rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=f"m={m}"
            )
    assert calls == [fastest, fastest]  # one-row calls only, with the tuned config


def test_the_tuner_times_a_gated_layer_as_it_runs(device, seed, checks, monkeypatch):
    """A gated MLP's down projection is timed with the activation folded into the skinny
    kernel (a [M, 2K] input) against the activation kernel followed by cuBLAS (a [M, K]
    input), and ``gated_forward`` then runs the winner."""
    from jacana_engine.kernels.activation import silu_and_mul
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning import decode_gemm

    k, n = 96, 40
    events = []

    def price(event):
        events.append(event)
        return 1.0 if event[0] == "cublas" else 0.5

    monkeypatch.setattr(decode_gemm, "_time", _FakeClock(monkeypatch, price))
    layers = [Linear(k, n, bias=False).to(device).requires_grad_(False) for _ in range(2)]
    for layer in layers:
        layer.gated_input = True
    picked = decode_gemm._tune_shape(layers, [1, 2])
    assert set(picked) == {1, 2}
    assert {e[0] for e in events} == {"cublas", "gated"}
    assert {e[2] for e in events if e[0] == "cublas"} == {k}
    gate_up = torch.randn(2, 2 * k, device=device)
    expected = torch.nn.functional.linear(silu_and_mul(gate_up), layers[0].weight)
    rel_l2, max_rel = TOL[torch.float32]
    checks.close(
        layers[0].gated_forward(gate_up, silu_and_mul),
        expected,
        rel_l2=rel_l2,
        max_rel=max_rel,
        seed=seed,
        what="gated",
    )


def test_a_candidate_that_fails_costs_only_its_own_chance(device, monkeypatch, caplog):
    """Fake clock: a config that raises (a compiler or resource error on some GPU) is
    skipped and the fastest of the others kept; when every one fails, cuBLAS stays."""
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning import decode_gemm

    k, n = 64, 40
    broken, *others = candidate_configs(1, n, k)
    fastest = others[-1]

    def price(event):
        if event[0] == "cublas":
            return 1.0
        if event[2] == broken:
            raise RuntimeError("out of resources")
        return 0.5 if event[2] == fastest else 0.8

    def every_candidate_fails(event):
        if event[0] == "cublas":
            return 1.0
        raise RuntimeError("out of resources")

    for prices, want in ((price, {1: fastest}), (every_candidate_fails, {})):
        monkeypatch.setattr(decode_gemm, "_time", _FakeClock(monkeypatch, prices))
        layers = [Linear(k, n, bias=False).to(device).requires_grad_(False) for _ in range(2)]
        assert decode_gemm._tune_shape(layers, [1]) == want
    assert "skipped: RuntimeError: out of resources" in caplog.text


def test_a_tuning_cache_spares_the_second_start_its_timing(device, monkeypatch, tmp_path):
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning import decode_gemm
    from jacana_engine.tuning.cache import TuningCache

    k, n = 64, 40
    fastest = candidate_configs(1, n, k)[-1]

    def price(event):  # one row: the last candidate wins; two rows: cuBLAS stays
        if event[0] == "cublas":
            return 1.0
        return 0.5 if event[1] == 1 and event[2] == fastest else 0.95

    clock = _FakeClock(monkeypatch, price)
    timings = []
    monkeypatch.setattr(decode_gemm, "_time", lambda *a: timings.append(1) or clock(*a))
    per_start = []
    for _ in range(2):  # the first start times and writes, the second one only reads
        layers = [Linear(k, n, bias=False).to(device).requires_grad_(False) for _ in range(2)]
        cache = TuningCache(tmp_path / "tuning.json")
        assert decode_gemm._tune_shape(layers, [1, 2], cache=cache) == {1: fastest}
        assert all(dict(layer.skinny_configs) == {1: fastest} for layer in layers)
        per_start.append(len(timings))
        timings.clear()
    assert per_start[0] > 0 and per_start[1] == 0


def _tail_cases(device):
    """(dtype, gated, m, k, n, configs) for the norm epilogue, as ``_gated_cases``."""
    for dtype, m, k, n, configs in _gated_cases(device):
        for gated in (False, True):
            yield dtype, gated, m, k, n, configs


def test_norm_epilogue_equals_the_gemm_then_the_norm_kernel(device, seed, checks):
    """The product (plain or gated) plus a residual, normalized by the last program:
    the new residual bit-exact against the GEMM then ``fused_add_rms_norm``, in place;
    the output within tolerance and mostly the same bits (statistics summed in another
    order); the arrival counter back at zero after every launch."""
    from jacana_engine.kernels._arrivals import arrival_counters
    from jacana_engine.kernels.skinny_gemm import COUNTERS, NormEpilogue

    for case, (dtype, gated, m, k, n, configs) in enumerate(_tail_cases(device)):
        x = torch.randn(m, 2 * k if gated else k, device=device).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        nw = (1 + 0.1 * torch.randn(n, device=device)).to(dtype)
        residual = torch.randn(m, n, device=device).to(dtype)
        for cfg in _share_of(configs, case, device):
            product = skinny_linear(x, w, config=cfg, gated=gated)
            want, summed = fused_add_rms_norm(product, residual, nw, 1e-6)
            new_residual = residual.clone()
            tail = NormEpilogue(nw, 1e-6, new_residual, new_residual)
            got = skinny_linear(x, w, config=cfg, gated=gated, then_norm=tail)
            what = f"{dtype} gated={gated} m={m} {cfg}"
            assert torch.equal(new_residual, summed), f"{what} seed={seed}"
            assert not arrival_counters(COUNTERS, x.device, 1).any(), what
            rel_l2, max_rel = TOL[dtype]
            checks.close(got, want, rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=what)
            checks.mostly_equal(got, want, max_fraction=0.02, seed=seed, what=what)


def test_norm_epilogue_rejects_what_it_cannot_do(device):
    from jacana_engine.kernels.skinny_gemm import NormEpilogue

    x, w = torch.randn(2, 32, device=device), torch.randn(8, 32, device=device)
    residual = torch.randn(2, 8, device=device)
    tail = NormEpilogue(torch.ones(8, device=device), 1e-6, residual, residual)
    with pytest.raises(ValueError, match="exclude each other"):
        prologue = NormPrologue(torch.ones(32, device=device), 1e-6)
        skinny_linear(x, w, norm=prologue, then_norm=tail)
    with pytest.raises(ValueError, match="does not match N"):
        skinny_linear(
            x, w, then_norm=NormEpilogue(torch.ones(9, device=device), 1e-6, *[residual] * 2)
        )
    with pytest.raises(ValueError, match="residual"):
        short = torch.randn(1, 8, device=device)
        skinny_linear(
            x, w, then_norm=NormEpilogue(torch.ones(8, device=device), 1e-6, short, short)
        )


def test_a_norm_split_over_two_gemms_equals_gemm_norm_gemm(device, seed, checks):
    """``ResidualStats`` then ``NormPrologue(stats=...)``, the producer on
    ``stats_config``'s tile of each candidate: its sum bit-exact against the GEMM then
    ``fused_add_rms_norm``, in place; its partial sums add up to the row's sum of
    squares; the consumer's output bit-exact against the norm kernel then the same GEMM
    (the statistics summed in torch's order, as the norm kernel sums them), with and
    without the consumer's dependent-launch tile order."""
    from jacana_engine.kernels.skinny_gemm import ResidualStats, stats_columns, stats_config

    n2 = 24  # the consumer's width
    for case, (dtype, gated, m, k, n, configs) in enumerate(_tail_cases(device)):
        x = torch.randn(m, 2 * k if gated else k, device=device).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        w2 = (torch.randn(n2, n, device=device) * n**-0.5).to(dtype)
        nw = (1 + 0.1 * torch.randn(n, device=device)).to(dtype)
        residual = torch.randn(m, n, device=device).to(dtype)
        consumer_cfgs = candidate_configs(m, n2, n)[:2]
        consumer_cfgs.append(dataclasses.replace(consumer_cfgs[0], pdl=True))  # peeled
        producer_cfgs = [stats_config(c, n, m) for c in _share_of(configs, case, device)]
        for cfg, cfg2 in zip(dict.fromkeys(producer_cfgs), itertools.cycle(consumer_cfgs)):
            product = skinny_linear(x, w, config=cfg, gated=gated)
            normed, summed = fused_add_rms_norm(product, residual, nw, 1e-6)
            want = skinny_linear(normed, w2, config=cfg2)
            h = residual.clone()
            stats = torch.full((m, stats_columns(n, m)), float("nan"), device=device)
            tail = ResidualStats(h, stats)
            skinny_linear(x, w, config=cfg, gated=gated, then_stats=tail, out=h)
            what = f"{dtype} gated={gated} m={m} {cfg} then {cfg2}"
            assert torch.equal(h, summed), f"{what} seed={seed}"
            squares = (summed.double() ** 2).sum(dim=1)
            checks.close(stats.sum(dim=1), squares, rel_l2=1e-6, max_rel=1e-5, seed=seed, what=what)
            got = skinny_linear(h, w2, config=cfg2, norm=NormPrologue(nw, 1e-6, stats=stats))
            assert torch.equal(got, want), f"{what} seed={seed}"


def test_a_split_norms_producer_takes_torchs_rows(device):
    """``stats_config``: BLOCK_N four times the passes of torch's reduction, BLOCK_K cut
    to keep the tile's area, None past the kernel's widest tile; the launcher refuses
    another BLOCK_N and statistics of another width."""
    from jacana_engine.kernels.skinny_gemm import ResidualStats, stats_columns, stats_config

    cfg = SkinnyConfig(1, 8, 1024, False, pdl=True)
    assert stats_config(cfg, 4096, 1) == cfg  # 512 threads a row, 2 passes: 8 rows
    assert stats_config(cfg, 4096, 2) == dataclasses.replace(cfg, block_n=16, block_k=512)
    assert stats_config(cfg, 1024, 1) == dataclasses.replace(cfg, block_n=4)
    assert stats_config(cfg, 8192, 16) is None  # 32 threads a row: 256 rows a program
    widths = stats_columns(4096, 1), stats_columns(576, 1), stats_columns(4096, 16)
    assert widths == (512, 128, 32)
    x, w = torch.randn(1, 32, device=device), torch.randn(64, 32, device=device)
    residual, stats = torch.randn(1, 64, device=device), torch.empty(1, 16, device=device)
    with pytest.raises(ValueError, match="takes 4 rows a program"):
        wrong = SkinnyConfig(1, 8, 32, False)
        skinny_linear(x, w, config=wrong, then_stats=ResidualStats(residual, stats))
    with pytest.raises(ValueError, match="want 64 columns"):  # torch's 64 threads a row
        stats = torch.empty(1, 8, device=device)
        norm = NormPrologue(torch.ones(64, device=device), 1e-6, stats=stats)
        skinny_linear(residual, torch.randn(8, 64, device=device), norm=norm)


def test_a_split_norm_rejects_what_it_cannot_run(device):
    from jacana_engine.kernels.skinny_gemm import ResidualStats

    x, w = torch.randn(2, 32, device=device), torch.randn(8, 32, device=device)
    residual = torch.randn(2, 8, device=device)
    cfg = dataclasses.replace(pick_config(2, 8, 32), block_n=4)  # torch's 8 threads, 4 rows
    with pytest.raises(ValueError, match="cannot hold"):  # fewer columns than programs
        skinny_linear(x, w, config=cfg, then_stats=ResidualStats(residual, torch.empty(2, 0)))
    with pytest.raises(ValueError, match="float32"):
        stats = torch.empty(2, 4, dtype=torch.float64, device=device)
        skinny_linear(x, w, config=cfg, then_stats=ResidualStats(residual, stats))
    with pytest.raises(ValueError, match="exclude each other"):
        stats = torch.empty(2, 4, device=device)
        tail = ResidualStats(residual, stats)
        skinny_linear(x, w, norm=NormPrologue(torch.ones(32, device=device), 1e-6), then_stats=tail)
    with pytest.raises(ValueError, match="no residual"):
        stats = torch.empty(2, 4, device=device)
        both = NormPrologue(torch.ones(32, device=device), 1e-6, x, torch.empty_like(x), stats)
        skinny_linear(x, w, norm=both)


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


@pytest.mark.gpu
def test_tune_decode_gemms_keeps_the_outputs(gpu, device, seed, checks):
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning.decode_gemm import tune_decode_gemms

    model = torch.nn.Sequential(
        *[Linear(2048, 1024, bias=False) for _ in range(8)],
        *[Linear(1024, 6144, bias=True) for _ in range(2)],
    ).to(device, torch.bfloat16)
    model.requires_grad_(False)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=2048**-0.5)
    chosen = tune_decode_gemms(model, rows=range(1, 5))
    assert set(chosen) == {(1024, 2048, torch.bfloat16), (6144, 1024, torch.bfloat16)}
    for layer in model:
        out, k = layer.weight.shape
        assert dict(layer.skinny_configs) == chosen[(out, k, torch.bfloat16)]
        for m, cfg in layer.skinny_configs.items():
            assert cfg in candidate_configs(m, out, k), (m, cfg)
        for m in range(1, 5):
            x = torch.randn(m, layer.in_features, device=device, dtype=torch.bfloat16)
            expected = torch.nn.functional.linear(x.float(), layer.weight.float(), None)
            if layer.bias is not None:
                expected += layer.bias.float()
            rel_l2, max_rel = TOL[torch.bfloat16]
            checks.close(
                layer(x).float(), expected, rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=f"{m}"
            )


# The folded norms sum a row's squares in another order than the norm kernel, so a
# normalized element now and then rounds to its bf16 neighbour. Before a GEMM that moves
# every output of its row by about 1e-4 of its size, which flips the bf16 rounding of a
# few percent of them (a bound of 1% failed on an H200). Leaving the normalized values
# unrounded would change about a fifth of them, so this still tells the two apart.
FOLDED_NORM_FLIPS = 0.05


@pytest.mark.gpu
@pytest.mark.slow  # an opt-in fold, ~80 s: gpu_suite.sh's skinny phase runs it, check does not
@pytest.mark.parametrize("name", ["0.6B o", "0.6B down", "8B o", "8B down"])
def test_norm_epilogue_at_qwen3_sizes_gpu(gpu, device, seed, checks, name):
    """The norm folded into the end of the o or (gated) down projection, every candidate
    config including the PDL ones, 1-16 rows: the new residual bit-exact against the GEMM
    then the norm kernel, the output within one ulp of the largest and mostly the same
    bits; then a CUDA graph of a PDL launch replayed with new inputs gives what an eager
    launch gives (the arrival counter resets itself between replays)."""
    from jacana_engine.kernels._arrivals import arrival_counters
    from jacana_engine.kernels.skinny_gemm import COUNTERS, NormEpilogue

    k, n = QWEN3_SHAPES[name]
    gated = name.endswith("down")
    w = (torch.randn(n, k, device=device) * k**-0.5).bfloat16()
    nw = (1 + 0.1 * torch.randn(n, device=device)).bfloat16()

    def inputs(m):
        x = torch.randn(m, 2 * k if gated else k, device=device).bfloat16()
        return x, torch.randn(m, n, device=device).bfloat16()

    for m in (1, 2, 4, 8, 16):
        x, residual = inputs(m)
        for cfg in candidate_configs(m, n, k, pdl=True):
            want, summed = fused_add_rms_norm(
                skinny_linear(x, w, config=cfg, gated=gated), residual, nw, 1e-6
            )
            new_residual = residual.clone()
            tail = NormEpilogue(nw, 1e-6, new_residual, new_residual)
            got = skinny_linear(x, w, config=cfg, gated=gated, then_norm=tail)
            what = f"{name} m={m} {cfg}"
            assert torch.equal(new_residual, summed), f"{what} seed={seed}"
            checks.close(got, want.float(), rel_l2=3e-3, max_rel=ONE_ULP, seed=seed, what=what)
            checks.mostly_equal(got, want, max_fraction=FOLDED_NORM_FLIPS, seed=seed, what=what)
    assert not arrival_counters(COUNTERS, device, 1).any()
    cfg = dataclasses.replace(candidate_configs(1, n, k)[0], pdl=True)

    def run(x, residual):
        tail = NormEpilogue(nw, 1e-6, residual, residual)
        return skinny_linear(x, w, config=cfg, gated=gated, then_norm=tail)

    _check_graph_replays_as_eager(run, inputs, seed)
    assert not arrival_counters(COUNTERS, device, 1).any()


def _check_graph_replays_as_eager(run, inputs, seed) -> None:
    """``run(x, residual)`` (its output; the residual updated in place) captured in a CUDA
    graph on ``inputs(1)``, then replayed three times with new inputs copied in: the
    output and the residual equal an eager run's on the same inputs, bit for bit."""
    x, residual = inputs(1)
    run(x, residual.clone())  # compile outside
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = run(x, residual)
    for _ in range(3):
        new_x, new_residual = inputs(1)
        x.copy_(new_x)
        residual.copy_(new_residual)
        graph.replay()
        eager_residual = new_residual.clone()
        want = run(new_x, eager_residual)
        torch.cuda.synchronize()
        assert torch.equal(got, want) and torch.equal(residual, eager_residual), seed


@pytest.mark.gpu
@pytest.mark.slow  # an opt-in fold, ~80 s: gpu_suite.sh's skinny and split phases run it
@pytest.mark.parametrize(
    "producer,consumer", [("8B o", "8B gate_up"), ("8B down", "8B qkv"), ("0.6B down", "0.6B qkv")]
)
def test_split_norm_at_qwen3_sizes_gpu(gpu, device, seed, checks, producer, consumer):
    """A norm split over the o (or gated down) projection and the gate/up (or QKV) one
    after it, every candidate config of the producer with PDL (on ``stats_config``'s
    tile), 1-4 rows: the residual sum and the consumer's output bit-exact against the
    GEMM, the norm kernel and the same consumer config; then the pair in a CUDA graph
    replayed with new inputs gives what eager launches give. (The reference GEMM runs on
    the producer's tile too: ``stats_config`` may shrink BLOCK_K, which reorders the
    product's sums.)"""
    from jacana_engine.kernels.skinny_gemm import ResidualStats, stats_columns, stats_config

    k, n = QWEN3_SHAPES[producer]
    n2 = QWEN3_SHAPES[consumer][1]
    gated = producer.endswith("down")
    w = (torch.randn(n, k, device=device) * k**-0.5).bfloat16()
    w2 = (torch.randn(n2, n, device=device) * n**-0.5).bfloat16()
    nw = (1 + 0.1 * torch.randn(n, device=device)).bfloat16()

    def inputs(m):
        x = torch.randn(m, 2 * k if gated else k, device=device).bfloat16()
        return x, torch.randn(m, n, device=device).bfloat16()

    def split(x, h, cfg, cfg2):  # h: the residual, overwritten with the sum
        stats = torch.empty(x.shape[0], stats_columns(n, x.shape[0]), device=device)
        cfg = stats_config(cfg, n, x.shape[0])
        skinny_linear(x, w, config=cfg, gated=gated, then_stats=ResidualStats(h, stats), out=h)
        return skinny_linear(h, w2, config=cfg2, norm=NormPrologue(nw, 1e-6, stats=stats))

    # the row counts the engine splits at (norm.MIN_SPLIT_PROGRAMS: 4096 and 1024 wide
    # rows have at least 128 torch reduction threads up to 4 rows)
    for m in (1, 2, 4):
        x, residual = inputs(m)
        consumer_cfgs = candidate_configs(m, n2, n, pdl=True)
        for i, cfg in enumerate(candidate_configs(m, n, k, pdl=True)):
            cfg2 = consumer_cfgs[i % len(consumer_cfgs)]
            # the product on the producer's tile: another BLOCK_K adds it in another order
            product = skinny_linear(x, w, config=stats_config(cfg, n, m), gated=gated)
            normed, summed = fused_add_rms_norm(product, residual, nw, 1e-6)
            want = skinny_linear(normed, w2, config=cfg2)
            h = residual.clone()
            got = split(x, h, cfg, cfg2)
            what = f"{producer} m={m} {cfg} then {cfg2}"
            assert torch.equal(h, summed), f"{what} seed={seed}"
            assert torch.equal(got, want), f"{what} seed={seed}"
    cfg = dataclasses.replace(candidate_configs(1, n, k)[0], pdl=True)
    cfg2 = dataclasses.replace(candidate_configs(1, n2, n)[0], pdl=True)
    _check_graph_replays_as_eager(lambda x, h: split(x, h, cfg, cfg2), inputs, seed)


def test_the_tuners_picks_are_described_per_shape():
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning.decode_gemm import describe_decode_gemms

    model = torch.nn.Sequential(Linear(64, 40), Linear(64, 40), Linear(32, 64), Linear(32, 64))
    tuned = SkinnyConfig(1, 8, 64, False, pdl=True, prefetch_tiles=2)
    for layer in model[:2]:
        layer.skinny_configs = {1: tuned, 2: SkinnyConfig(2, 8, 64, False)}
    model[2].gated_input = model[3].gated_input = True
    assert describe_decode_gemms(model) == {
        "40x64": {"skinny": {1: "8x64 pdl+2", 2: "8x64"}},
        "64x32 gated": {},
    }


def test_decode_gemm_row_bound_is_the_kernels():
    from jacana_engine.tuning.decode_gemm import SKINNY_MAX_ROWS

    assert SKINNY_MAX_ROWS == MAX_M


def test_l2_prefetch_compiles_to_one_bulk_prefetch_per_thread_for_hopper():
    """``SkinnyConfig.l2_prefetch_bytes``: the kernel compiled for sm90 (on this machine)
    issues ``cp.async.bulk.prefetch.L2`` before its PDL wait, and only when asked."""
    from hopper_codegen import hopper_ptx_counts

    counts = {c: n["cp.async.bulk.prefetch.L2"] for c, n in hopper_ptx_counts().items()}
    assert counts["skinny_pdl_l2"] >= 1 and counts["skinny_pdl"] == 0, counts


def test_weights_load_past_l1_and_an_activating_launch_runs_silu_for_hopper():
    """Compiled for sm90 at the 8B gate_up's 2x4096 folded tile: by default the weight
    loads are ``ld.global.cg`` (cached in L2 only, ``SkinnyConfig.weight_cache``), with
    ``weight_cache=""`` none is; only the activating launch computes an exponential (its
    SiLU in the epilogue)."""
    from hopper_codegen import hopper_ptx_counts

    counts = hopper_ptx_counts()
    act, plain = counts["skinny_folded_act"], counts["skinny_folded_through_l1"]
    assert act["ld.global.cg"] >= 1 and plain["ld.global.cg"] == 0, counts
    assert act["ex2.approx"] >= 1 and plain["ex2.approx"] == 0, counts


def test_lookahead_asks_for_the_next_tile_right_after_the_wait_for_hopper():
    """``SkinnyConfig.lookahead`` compiled for sm90 (the 8B qkv's 2x2048, PDL): the same
    loads before the wait (the prefetched tile), and after it the loop's first weight
    tile beside x, before the first branch; without it only x's tile is asked for there."""
    from hopper_codegen import hopper_ptx_counts

    counts = hopper_ptx_counts()
    plain, ahead = counts["skinny_2x2048"], counts["skinny_2x2048_ahead"]
    assert plain["loads_before_wait"] == ahead["loads_before_wait"] > 0, counts
    assert ahead["loads_after_wait"] == plain["loads_after_wait"] + plain["loads_before_wait"]


def test_a_split_norm_compiles_for_hopper_with_the_first_tile_beside_the_statistics():
    """The split norm's producer (torch's 512 threads) and consumer (their 512 sums
    halved) at the 8B's one-row tiles compile for sm90 (the consumer's halving once took
    minutes to compile), and after its wait the consumer asks for the statistics, x's
    first tile and the norm weight's before its first branch: one load more than the
    plain GEMM's x tile; and it halves the sums with no barrier before 1/rms (slices of
    32, then shuffles: halving a [512] tile took 7 barriers and cost the 8B chain 0.41 ms
    a step on an H200)."""
    from hopper_codegen import hopper_ptx_counts

    counts = hopper_ptx_counts()
    producer, consumer = counts["skinny_split_producer"], counts["skinny_split_consumer"]
    assert producer["griddepcontrol.wait"] == consumer["griddepcontrol.wait"] == 1, counts
    assert consumer["loads_after_wait"] > counts["skinny_pdl"]["loads_after_wait"], counts
    assert consumer["barriers_before_rsqrt"] == 0, counts


def _l2(total: int, *, tiles: int = 1, pdl: bool = True) -> SkinnyConfig:
    return SkinnyConfig(1, 8, 1024, False, pdl=pdl, prefetch_tiles=tiles, l2_prefetch_bytes=total)


@pytest.mark.parametrize(
    ("cfg", "shape", "want"),
    [
        # 8 MiB over 4096 rows: 2 KB a row, in 8 pieces of 256 bytes
        (_l2(8 << 20), (4096, 4096), (2048, 8)),
        # the same budget over 24576 rows: 341 bytes a row, one piece of 336
        (_l2(8 << 20), (24576, 4096), (336, 1)),
        # over 151936 rows (an lm_head): 55 bytes a row, below a piece: nothing
        (_l2(8 << 20), (151936, 4096), (0, 1)),
        # clamped to the 2 x 1024 elements left after two tiles (4 KB), 16 pieces
        (_l2(1 << 30, tiles=2), (4096, 4096), (4096, 16)),
        # 3,000 bytes a row: 8 pieces (the most of 256 bytes or more, a power of 2),
        # rounded down to 8 x 16 bytes
        (_l2(3000 * 64), (64, 4096), (2944, 8)),
        (_l2(0), (4096, 4096), (0, 1)),  # not asked
        (_l2(8 << 20, pdl=False), (4096, 4096), (0, 1)),  # no PDL wait to fill
    ],
)
def test_l2_prefetch_plan_shares_the_launch_budget_over_the_rows(cfg, shape, want):
    weight = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    assert l2_prefetch_plan(cfg, weight) == want


def test_l2_prefetch_is_off_for_unaligned_rows():
    cfg = SkinnyConfig(1, 8, 512, False, pdl=True, l2_prefetch_bytes=2048 * 64)
    weight = torch.empty(64, 4100, dtype=torch.bfloat16)[:, :4097]  # rows of 8,200 bytes
    assert l2_prefetch_plan(cfg, weight) == (0, 1)
    assert l2_prefetch_plan(cfg, torch.empty(64, 4096, dtype=torch.bfloat16)) == (2048, 8)
