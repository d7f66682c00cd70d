"""Launch parameters of the skinny GEMM: ``SkinnyConfig``, the rule of thumb
``pick_config``, and ``can_use`` (where the kernels apply).

A decode-sized linear layer multiplies M <= ``MAX_M`` rows of x by a large weight [N, K];
its cost is reading the weight once. Each program owns BLOCK_N output columns for all M
rows and streams its [BLOCK_N, K] weight slab in BLOCK_K chunks, so the weight is read
exactly once; BLOCK_N shrinks until the grid has ``TARGET_PROGRAMS`` programs or hits its
floor. Plain data on the host: nothing here imports a kernel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from jacana_engine.kernels._common import next_power_of_2

MAX_M = 16  # rows of x handled in one program; larger batches belong to cuBLAS
DOT_MIN_M = 16  # from this many rows up the inner product is tl.dot (16-row tiles)
TARGET_PROGRAMS = 264  # 2 programs per SM on a 132-SM H200
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FOLD = 8  # the folded kernel's K fold: one 16-byte vector of bf16
DOT_BLOCK_M = 16  # tl.dot needs >= 16 rows: x is padded with zero rows
MIN_BLOCK_N = {False: 8, True: 16}  # tl.dot needs >= 16 columns too
MAX_BLOCK_N = 128
MIN_BLOCK_K, MAX_BLOCK_K = 32, 512
MAX_DOT_BLOCK_K = 256
DOT_TILE = 8192  # weight elements per K step on the dot path (16 KiB in bf16)
SUM_PRODUCTS = 8192  # BLOCK_M * BLOCK_N * BLOCK_K on the sum path (64 fp32/thread)


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch parameters of one (M, N, K) shape, and which kernel runs it: the tile
    kernel (``k_fold == 1``), the folded kernel (``k_fold > 1``, one row) or its
    activating variant (``activates``)."""

    block_m: int
    block_n: int
    block_k: int
    use_dot: bool
    num_warps: int = 4
    num_stages: int = 3
    # Programmatic dependent launch (CUDA, compute capability 9.0+): the kernel lets the
    # next one launch at its start, loads its first weight tiles while the previous kernel
    # finishes, then waits for it (``griddepcontrol``); elsewhere only that tile order.
    pdl: bool = False
    # weight tiles loaded before that wait (with ``pdl``, 1 or 2; the folded kernels: 1):
    # more overlap a longer previous kernel (decode attention before o_proj) but hold
    # more registers
    prefetch_tiles: int = 1
    # tile kernel: the loop keeps the weight tile after the one it multiplies in flight,
    # the first of them loaded right after the PDL wait, before x: an HBM round trip no
    # longer waits for x's L2 round trip, nor a tile for the one before it. The same sums
    # in the same order: the same bits.
    lookahead: bool = False
    # 1: the tile kernel. F > 1 (a power of 2 dividing BLOCK_K): the folded kernel, which
    # loads each tile as [BLOCK_N, BLOCK_K / F, F] and adds a thread's F neighbouring
    # products in registers at every K step: its running sums take a float32 per F tile
    # elements, so a program takes about a third of the registers and an SM holds two to
    # three times the programs, and weight bytes in flight. Another order of sums.
    k_fold: int = 1
    # folded kernel only: the weight [2I, K] is a gated MLP's gate then up, and the launch
    # stores ``silu(gate) * up`` [1, I] (``activating.py``), so the down projection after
    # it reads I activated columns instead of activating in every one of its programs.
    activates: bool = False

    def grid(self, n: int) -> tuple[int]:
        return (triton.cdiv(n, self.block_n),)


def pick_config(m: int, n: int, k: int, *, use_dot: bool | None = None) -> SkinnyConfig:
    """The launch parameters for x [m, k] @ weight[n, k].T (``use_dot`` overrides the
    inner product choice, for benchmarks)."""
    if use_dot is None:
        use_dot = m >= DOT_MIN_M
    block_m = DOT_BLOCK_M if use_dot else next_power_of_2(m)
    block_n = MAX_BLOCK_N
    # halve until the grid fills the GPU, never below the floor nor far above N
    floor = MIN_BLOCK_N[use_dot]
    block_n = min(block_n, max(floor, next_power_of_2(n)))
    while block_n > floor and triton.cdiv(n, block_n) < TARGET_PROGRAMS:
        block_n //= 2
    if use_dot:  # capped so 3 float32 stages of x and weight tiles stay < 100 KiB of smem
        budget = min(MAX_DOT_BLOCK_K, DOT_TILE // block_n)
    else:
        budget = SUM_PRODUCTS // (block_m * block_n)
    block_k = min(MAX_BLOCK_K, max(MIN_BLOCK_K, budget), max(MIN_BLOCK_K, next_power_of_2(k)))
    return SkinnyConfig(block_m=block_m, block_n=block_n, block_k=block_k, use_dot=use_dot)


def can_use(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when ``skinny_linear(x, weight)`` applies: x [M <= MAX_M, K] and weight [N, K]
    both contiguous, of one supported dtype, on CUDA (or on CPU under Triton's
    interpreter, ``TRITON_INTERPRET=1``)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        return False
    if not 1 <= x.shape[0] <= MAX_M:
        return False
    if x.dtype != weight.dtype or x.dtype not in DTYPES or x.device != weight.device:
        return False
    if not (x.is_contiguous() and weight.is_contiguous()):
        return False
    if x.device.type == "cuda":
        return True
    return x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
