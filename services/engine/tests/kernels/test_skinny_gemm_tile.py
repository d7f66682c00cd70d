"""The tile kernel (``kernels/skinny_gemm/tile.py``) against float64 truth and its torch
reference: plain and gated x, both inner products, every candidate, PDL and lookahead
twins with the same bits.

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

from skinny_cases import CANDIDATE_SHAPES, QWEN3_SHAPES, check_product

from jacana_engine.kernels.activation import silu_and_mul
from jacana_engine.kernels.skinny_gemm import (
    MAX_M,
    candidate_configs,
    pick_config,
    skinny_linear,
)

SMALL = [(1, 64, 40), (3, 200, 96), (16, 200, 40), (5, 64, 96), (16, 64, 96)]


@pytest.mark.parametrize("m,k,n", SMALL)
@pytest.mark.parametrize("use_dot", [None, False, True])
def test_skinny_linear_float32(device, seed, checks, m, k, n, use_dot):
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device)
    out = skinny_linear(x, w, config=pick_config(m, n, k, use_dot=use_dot))
    assert out.shape == (m, n) and out.dtype == torch.float32
    check_product(out, x, w, seed, checks, f"float32 {m}x{k}x{n} dot={use_dot}")


@pytest.mark.parametrize("m,k,n", SMALL)
def test_skinny_linear_bfloat16(device, seed, checks, m, k, n):
    x = torch.randn(m, k, device=device).bfloat16()
    w = torch.randn(n, k, device=device).bfloat16()
    use_dot = None if device.type == "cuda" else False
    out = skinny_linear(x, w, config=pick_config(m, n, k, use_dot=use_dot))
    assert out.dtype == torch.bfloat16
    check_product(out, x, w, seed, checks, f"bfloat16 {m}x{k}x{n}")


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
    check_product(out, x, w, seed, checks, "out=")


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


def test_gated_kernel_gives_the_bits_of_silu_and_mul_then_the_kernel(device, seed):
    for dtype, m, k, n, configs in _gated_cases(device):
        gate_up = (torch.randn(m, 2 * k, device=device) * 2).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        activated = silu_and_mul(gate_up)  # [m, k]
        for cfg in configs:
            fused = skinny_linear(gate_up, w, config=cfg, gated=True)
            plain = skinny_linear(activated, w, config=cfg)
            assert torch.equal(fused, plain), f"{dtype} {(m, k, n)} {cfg} seed={seed}"


def test_gated_kernel_rejects_a_gate_up_of_the_wrong_width(device):
    w = torch.randn(8, 32, device=device)
    with pytest.raises(ValueError, match="width"):
        skinny_linear(torch.randn(2, 32, device=device), w, gated=True)
    with pytest.raises(ValueError, match="width"):
        skinny_linear(torch.randn(2, 65, device=device), w, gated=True)


def _plain_and_gated(gate_up, w, cfg) -> dict[str, torch.Tensor]:
    """The two kinds of product of one config: x = gate_up's first half; gated."""
    x = gate_up[:, : w.shape[1]].contiguous()
    return {
        "plain": skinny_linear(x, w, config=cfg),
        "gated": skinny_linear(gate_up, w, config=cfg, gated=True),
    }


_TWINS = (  # the ways a config may load its weights that must not change a sum
    dict(pdl=True),
    dict(pdl=True, prefetch_tiles=2),
    dict(lookahead=True),
    dict(pdl=True, lookahead=True),
    dict(pdl=True, prefetch_tiles=2, lookahead=True),
)


def test_pdl_and_lookahead_configs_give_the_bits_of_the_plain_ones(device, seed):
    """``pdl`` loads the first weight tile or two before the rest (and on CUDA launches
    with PDL), ``lookahead`` a tile ahead; the sums are the same, so plain and gated
    products keep their bits. On CUDA every twin of every candidate;
    under the interpreter (which runs each program in Python: the whole product took 200 s
    of ``make test``) every twin of every shape and dtype, on the candidates in turn."""
    for dtype, m, k, n, configs in _gated_cases(device):
        gate_up = torch.randn(m, 2 * k, device=device).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        if device.type == "cuda":
            pairs = [(cfg, twin) for cfg in configs for twin in _TWINS]
        elif not configs:  # bfloat16 on the dot path only: not on the interpreter
            continue
        else:
            pairs = [(configs[i % len(configs)], twin) for i, twin in enumerate(_TWINS)]
        wanted = {}
        for cfg, twin in pairs:
            if cfg not in wanted:
                wanted[cfg] = _plain_and_gated(gate_up, w, cfg)
            twin_cfg = dataclasses.replace(cfg, **twin)
            got = _plain_and_gated(gate_up, w, twin_cfg)
            for kind, want in wanted[cfg].items():
                assert torch.equal(got[kind], want), f"{kind} {twin_cfg} seed={seed}"


@pytest.mark.parametrize("m,k,n", CANDIDATE_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_candidate_config_matches(device, seed, checks, m, k, n, dtype):
    configs = candidate_configs(m, n, k)
    if dtype == torch.bfloat16 and device.type == "cpu":
        # the CPU interpreter's tl.dot is wrong on bfloat16 (module docstring): there the
        # sum path's candidates run, or the sum path's own pick where every one is a dot
        configs = [c for c in configs if not c.use_dot] or [pick_config(m, n, k, use_dot=False)]
    x = torch.randn(m, k, device=device).to(dtype)
    w = torch.randn(n, k, device=device).to(dtype)
    for cfg in configs:
        check_product(skinny_linear(x, w, config=cfg), x, w, seed, checks, f"{m}x{k}x{n} {cfg}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(QWEN3_SHAPES))
def test_skinny_linear_qwen3_gpu(gpu, device, seed, checks, name):
    k, n = QWEN3_SHAPES[name]
    w = (torch.randn(n, k, device=device) * k**-0.5).bfloat16()
    for m in (1, 2, 4, 8, 16):
        x = torch.randn(m, k, device=device).bfloat16()
        out = skinny_linear(x, w)
        check_product(out, x, w, seed, checks, f"{name} M={m}")
        assert torch.equal(out, skinny_linear(x, w)), f"{name} M={m} seed={seed}: not deterministic"


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
    or two tiles loaded before the wait."""
    k, n = QWEN3_SHAPES[name]
    weights = [(torch.randn(n, k, device=device) * k**-0.5).bfloat16() for _ in range(4)]
    for cfg, depth in itertools.product(candidate_configs(1, n, k)[:2], (1, 2)):
        twin = dataclasses.replace(cfg, pdl=True, prefetch_tiles=depth)

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
            check_product(out, x, w, seed, checks, f"graph replay M={m}")
