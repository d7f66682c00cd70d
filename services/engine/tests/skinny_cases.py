"""Shapes and checks the skinny GEMM tests share (``kernels/skinny_gemm``).

``QWEN3_SHAPES`` are the (K, N) of Qwen3's decoder linear layers, the family the kernels
were tuned on: the GPU tests run at those sizes; the interpreter tests use small ones.
"""

from __future__ import annotations

import torch

from jacana_engine.kernels.skinny_gemm.tile import tile_linear_ref

QWEN3_SHAPES = {
    "0.6B qkv": (1024, 4096),
    "0.6B o": (2048, 1024),
    "0.6B gate_up": (1024, 6144),
    "0.6B down": (3072, 1024),
    "8B qkv": (4096, 6144),
    "8B o": (4096, 4096),
    "8B gate_up": (4096, 24576),
    "8B down": (12288, 4096),
}
# One bf16 ulp of the largest output, relative to it. A bf16 output rounds each element by
# up to half an ulp, which is up to 2^-8 of the largest when that one sits just below a
# power of two, and the float32 sums add their own ordering error on top (a bound of 4e-3
# failed one run in four on an H200, at 4.98e-3).
ONE_ULP = 2**-7
TOL = {torch.float32: (1e-6, 1e-5), torch.bfloat16: (3e-3, ONE_ULP)}
TOL_BF16_TRUNCATED = (6e-3, 8e-3)  # the CPU interpreter truncates float32 -> bfloat16
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


def check_product(out, x, w, seed, checks, what) -> None:
    """``out`` against x @ w.T in float64 (``TOL``), and on CUDA in bfloat16 mostly equal
    to the torch reference rounded once (at most 1% of the elements a rounding apart)."""
    truth = x.double() @ w.double().T  # [M, N]
    rel_l2, max_rel = TOL[x.dtype]
    if x.dtype == torch.bfloat16 and out.device.type == "cpu":
        rel_l2, max_rel = TOL_BF16_TRUNCATED
    checks.close(out, truth, rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=what)
    if x.dtype != torch.float32 and out.device.type == "cuda":
        ref = tile_linear_ref(x, w)
        checks.mostly_equal(out, ref, max_fraction=0.01, seed=seed, what=what)
