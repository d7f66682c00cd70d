"""Skinny GEMM for decode-sized linear layers: ``x @ weight.T`` with few rows of ``x``.

At decode time a linear layer sees M <= 16 rows against a large weight [N, K]; the
cost is reading the weight once, and cuBLAS reaches only a fraction of the HBM
bandwidth on small weights. Here each program owns BLOCK_N output columns for all M
rows and streams its [BLOCK_N, K] weight slab in BLOCK_K chunks, so the weight is read
exactly once. BLOCK_N shrinks until the grid has >= ``TARGET_PROGRAMS`` programs (two
per SM on an H200) or hits its floor.

Two inner products, chosen per call (``pick_config``):

- ``tl.dot`` with x padded to 16 rows (tensor cores; the padding is free, the kernel
  is memory bound), used from ``DOT_MIN_M`` rows up;
- a broadcast multiply for fewer rows (no padding, no shared memory round trip for the
  weight), its products accumulated elementwise over the K steps and summed over
  BLOCK_K once at the end;
- at one row, the same multiply folded (``SkinnyConfig.k_fold``, ``_folded_skinny_kernel``):
  each thread adds its 8 neighbouring products of a K step at once, so the running sums
  take an eighth of the registers and an SM holds more programs, and more weight bytes in
  flight (the tuner's pick for most Qwen3-8B shapes at batch 1 on an H200).

``pick_config`` is a rule of thumb; at start-up ``layers.decode_gemm`` times the few
alternatives of ``candidate_configs`` on the model's own weights and keeps the fastest
(at one row on an H200, ``bench/results/skinny_gemm_sweep.md``, another tile beat
pick_config's on every Qwen3 shape, mostly a narrower or deeper one).

What x is, per launch: the input as is; or a gated MLP's gate_up, activated as it
loads (``gated``: SiLU-and-mul folded in, the down projection's case); or the input of an
RMSNorm (with its residual add), normalized as it loads (``norm``: the norm folded into
the QKV or gate/up projection after it), its statistics summed by every program or, with
``NormPrologue.stats``, read from the partial sums the GEMM before it stored, or
(``NormPrologue.deferred``) applied to the product instead, its statistics gathered as
the loop loads x (with no weight of its own where the GEMM's weight holds it: the folded
kernel too). What the output is: the product; or, with ``then_residual``, the product
plus a residual (both kernels); or, with ``then_norm``, the RMSNorm
of the product plus a residual, the last program to finish normalizing the rows (the
norm folded into the o or down projection before it); or, with ``then_stats``, the
product plus a residual and each program's sum of squares of its columns of it
(``ResidualStats``: the norm split between two GEMMs, no program reading a whole row and
none waiting for the others; the programs take the columns torch's reduction threads
take, so the split norm gives ``kernels.rmsnorm``'s bits).
``SkinnyConfig.pdl`` launches with programmatic dependent launch.

Deterministic: each output element is reduced over K by one program in a fixed order,
no split-K, so results are bitwise identical run to run (the norm epilogue's counter
only elects the program that normalizes; the sums do not depend on which one it is).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._arrivals import arrival_counters
from jacana_engine.kernels._common import check_last_dim_contiguous, dot_precision, next_power_of_2
from jacana_engine.kernels._pdl import pdl_launch
from jacana_engine.kernels._row_sum_order import (
    RowSumOrder,
    halved_sum_from,
    left_to_right,
    thread_column,
    torch_row_sum_order,
    unfused,
)
from jacana_engine.kernels._trace import END, START, WAITED, WORKED, stamp, trace_slot
from jacana_engine.kernels.activation import silu_mul_rounded
from jacana_engine.kernels.rmsnorm import rms_norm_row, rms_scale, row_norm_args

MAX_M = 16  # rows of x handled in one program; larger batches belong to cuBLAS
COUNTERS = "skinny_gemm"  # the norm epilogue's arrival counter (kernels/_arrivals.py)
DOT_MIN_M = 16  # from this many rows up the inner product is tl.dot (16-row tiles)
TARGET_PROGRAMS = 264  # 2 programs per SM on a 132-SM H200
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DOT_BLOCK_M = 16  # tl.dot needs >= 16 rows: x is padded with zero rows
_MIN_BLOCK_N = {False: 8, True: 16}  # tl.dot needs >= 16 columns too
_MAX_BLOCK_N = 128
_MIN_BLOCK_K, _MAX_BLOCK_K = 32, 512
_MAX_DOT_BLOCK_K = 256
_DOT_TILE = 8192  # weight elements per K step on the dot path (16 KiB in bf16)
_SUM_PRODUCTS = 8192  # BLOCK_M * BLOCK_N * BLOCK_K on the sum path (64 fp32/thread)
# one-row candidates: tiles of 4096 or 8192 weight elements, BLOCK_K of 512-2048, the
# families of the winner or runner-up of bench/skinny_gemm_gpu.py's launch sweep on
# every Qwen3 shape
_ONE_ROW_TILES = (_SUM_PRODUCTS // 2, _SUM_PRODUCTS)
_ONE_ROW_BLOCK_KS = (512, 1024, 2048)
_MIN_CANDIDATE_BLOCK_N = 2
# the folded kernel's K fold (one 16-byte vector of bf16) and its larger tiles' elements
FOLD = 8
_FOLDED_TILE = 2 * _SUM_PRODUCTS
# weight tiles the folded candidates load before their wait: one, as measured so far; a
# bench tool may add 2 (``bench/graph_picks_gpu.py``, ``$FOLDED_PEELS``), each where a row
# holds that many tiles
FOLDED_PEELS: tuple[int, ...] = (1,)
# ... and rows whole, one tile a program (BLOCK_N 1 or 2), up to this K (its power of 2):
# with PDL a resident program then holds all of its weight before the wait
_WHOLE_ROW_MAX_K = 4096
# The shapes it is measured on (tests, bench/skinny_gemm_gpu.py): (K, N) of Qwen3's
# decoder linear layers.
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


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch parameters of one (M, N, K) shape."""

    block_m: int
    block_n: int
    block_k: int
    use_dot: bool
    num_warps: int = 4
    num_stages: int = 3
    # Programmatic dependent launch (CUDA, compute capability 9.0+): the kernel lets the
    # next one launch at its start, loads its first weight tile while the previous kernel
    # finishes, then waits for it (``griddepcontrol``); elsewhere only that tile order.
    pdl: bool = False
    # weight tiles loaded before that wait (with ``pdl``): more overlap a longer previous
    # kernel (decode attention before o_proj) but hold more registers
    prefetch_tiles: int = 1
    # Triton's eviction_policy for the weight loads ("": the default; "evict_first": the
    # weight streams through L2 once and should not push out what the next kernels read)
    weight_eviction: str = ""
    # Triton's cache_modifier for the weight loads: ".cg" caches them in L2 only, so the
    # weight, read once, streams past L1 and leaves it to x, which every program of an SM
    # reads again ("": through L1). On an H200, Qwen3-8B's one-row layer chain ran 3-9 µs
    # faster with it in three pairs of variants, at the same energy a replay
    # (bench/results/power_probe_gpu_v40_l1.md)
    weight_cache: str = ".cg"
    # with ``pdl`` on CUDA: before their wait the programs of a launch also ask L2 to
    # prefetch about this many bytes of the weight in all, an equal share of each row
    # after the tiles they load (``cp.async.bulk.prefetch.L2``), so HBM streams weights
    # while the previous kernel runs (``l2_prefetch_plan``); 0: off (``EngineConfig``'s
    # ``l2_prefetch_bytes`` sets it on the tuner's picks). A launch's total, not a row's:
    # a fixed share a row asked 50 MB of L2 for the 8B gate_up at 2 KB a row, and was slower
    l2_prefetch_bytes: int = 0
    # the loop keeps the weight tile after the one it multiplies in flight, the first of
    # them loaded right after the PDL wait, before x: an HBM round trip no longer waits
    # for x's L2 round trip, nor a tile for the one before it (two tiles in flight a
    # program). The same sums in the same order: the same bits.
    lookahead: bool = False
    # 1: the tile kernel above. F > 1 (a power of 2, at most BLOCK_K): the folded kernel
    # (``_folded_skinny_kernel``; one row, plain or gated x, no folded norm), which loads
    # each tile as [BLOCK_N, BLOCK_K / F, F] and adds a thread's F neighbouring products
    # in registers at every K step: its running sums take a float32 per F tile elements,
    # not one each, so a program takes about a third of the registers and an SM holds
    # two to three times the programs, and weight bytes in flight. Another order of sums.
    k_fold: int = 1
    # folded kernel only: the weight [2I, K] is a gated MLP's gate then up, and the launch
    # stores ``silu(gate) * up`` [1, I] (``skinny_linear`` with it): a program takes
    # BLOCK_N / 2 pairs, gate row j beside up row I + j, and activates them as it stores,
    # so the down projection after it reads I activated columns instead of computing
    # SiLU-and-mul again in every one of its programs. The sums are this tile's, the
    # activation is rounded as ``kernels.activation`` rounds it: the same bits as the plain
    # launch of this tile followed by ``silu_and_mul``.
    activates: bool = False

    def grid(self, n: int) -> tuple[int]:
        return (triton.cdiv(n, self.block_n),)


def pick_config(m: int, n: int, k: int, *, use_dot: bool | None = None) -> SkinnyConfig:
    """The launch parameters for x [m, k] @ weight[n, k].T (``use_dot`` overrides the
    inner product choice, for benchmarks)."""
    if use_dot is None:
        use_dot = m >= DOT_MIN_M
    block_m = _DOT_BLOCK_M if use_dot else next_power_of_2(m)
    block_n = _MAX_BLOCK_N
    # halve until the grid fills the GPU, never below the floor nor far above N
    floor = _MIN_BLOCK_N[use_dot]
    block_n = min(block_n, max(floor, next_power_of_2(n)))
    while block_n > floor and triton.cdiv(n, block_n) < TARGET_PROGRAMS:
        block_n //= 2
    if use_dot:  # capped so 3 float32 stages of x and weight tiles stay < 100 KiB of smem
        budget = min(_MAX_DOT_BLOCK_K, _DOT_TILE // block_n)
    else:
        budget = _SUM_PRODUCTS // (block_m * block_n)
    block_k = min(_MAX_BLOCK_K, max(_MIN_BLOCK_K, budget), max(_MIN_BLOCK_K, next_power_of_2(k)))
    return SkinnyConfig(block_m=block_m, block_n=block_n, block_k=block_k, use_dot=use_dot)


def candidate_configs(
    m: int, n: int, k: int, *, pdl: bool = False, folded: bool = False, activating: bool = False
) -> list[SkinnyConfig]:
    """Launch configs worth timing for x [m, k] @ weight[n, k].T, ``pick_config``'s first,
    no duplicates, each with BLOCK_K <= max(32, next_power_of_2(k)).

    One row (6-9 configs): every BLOCK_N x BLOCK_K tile of 4096 or 8192 elements with
    BLOCK_K in {512, 1024, 2048} (capped by K; BLOCK_N >= 2 and <= N's power of two), and
    where K's power of two is above 2048 and at most ``_WHOLE_ROW_MAX_K``, whole rows of
    it (BLOCK_N 1 and 2). More rows on the sum path: one alternative, pick_config's tile
    half as wide and twice as deep (same registers per thread). The dot path:
    pick_config's alone (its tile already sits at the shared-memory budget and BLOCK_N
    floor). With ``pdl`` each comes twice, without and with programmatic dependent
    launch, and at one row the dependent ones once more with two weight tiles prefetched
    (where K holds more than two), and once more with ``lookahead`` (where K holds more
    than the one tile prefetched). With ``folded`` (one row, plain or gated x: the folded
    kernel folds no norm) and ``pdl``, every dependent one-row tile once more on the
    folded kernel (``k_fold`` ``FOLD``), and the tiles of ``_FOLDED_TILE`` elements too,
    which its fewer registers make room for; with ``activating`` too (the weight is a
    gated MLP's gate then up, N even), each of those of whole pairs of rows (BLOCK_N
    even) once more, activating (``SkinnyConfig.activates``: its output is then
    [1, N / 2])."""
    picked = pick_config(m, n, k)
    k_cap = max(_MIN_BLOCK_K, next_power_of_2(k))
    n_cap = min(_MAX_BLOCK_N, max(_MIN_CANDIDATE_BLOCK_N, next_power_of_2(n)))
    tiles: list[tuple[int, int]] = []  # (BLOCK_N, BLOCK_K)
    if m == 1:
        for area in _ONE_ROW_TILES:
            for block_k in _ONE_ROW_BLOCK_KS:
                block_k = min(block_k, k_cap)
                tiles.append((max(_MIN_CANDIDATE_BLOCK_N, min(n_cap, area // block_k)), block_k))
        if max(_ONE_ROW_BLOCK_KS) < k_cap <= _WHOLE_ROW_MAX_K:
            tiles += [(1, k_cap), (min(2, n_cap), k_cap)]
    elif not picked.use_dot and picked.block_k * 2 <= k_cap:
        tiles.append((max(_MIN_CANDIDATE_BLOCK_N, picked.block_n // 2), picked.block_k * 2))
    configs = [picked]
    for block_n, block_k in tiles:
        cfg = SkinnyConfig(picked.block_m, block_n, block_k, use_dot=picked.use_dot)
        if cfg not in configs:
            configs.append(cfg)
    if pdl:
        dependent = [dataclasses.replace(cfg, pdl=True) for cfg in configs]
        deeper = [  # one row: a second tile prefetched where K holds more than two
            dataclasses.replace(cfg, prefetch_tiles=2)
            for cfg in dependent
            if m == 1 and 2 * cfg.block_k < k
        ]
        ahead = [  # one row: the loop a tile ahead where it has one to load
            dataclasses.replace(cfg, lookahead=True)
            for cfg in dependent
            if m == 1 and cfg.block_k < k
        ]
        configs += dependent + deeper + ahead
        if folded and m == 1 and not picked.use_dot:
            on_folded = _folded_candidates(dependent, n, k)
            configs += on_folded
            if activating and n % 2 == 0:
                configs += [
                    dataclasses.replace(cfg, activates=True)
                    for cfg in on_folded
                    if cfg.block_n % 2 == 0
                ]
    return configs


def _folded_candidates(dependent: list[SkinnyConfig], n: int, k: int) -> list[SkinnyConfig]:
    """The one-row dependent tiles on the folded kernel, then its larger tiles (BLOCK_K
    of 1024 and 2048, capped by K), each with every ``FOLDED_PEELS`` count of tiles loaded
    before the wait that K holds, no duplicates."""
    k_cap = max(_MIN_BLOCK_K, next_power_of_2(k))
    n_cap = min(_MAX_BLOCK_N, max(_MIN_CANDIDATE_BLOCK_N, next_power_of_2(n)))
    larger = [
        (max(_MIN_CANDIDATE_BLOCK_N, min(n_cap, _FOLDED_TILE // min(bk, k_cap))), min(bk, k_cap))
        for bk in (1024, 2048)
    ]
    base = dependent[0]
    tiles = [(c.block_n, c.block_k) for c in dependent] + larger
    configs: list[SkinnyConfig] = []
    for block_n, block_k in tiles:
        for peel in FOLDED_PEELS:
            cfg = dataclasses.replace(
                base, block_n=block_n, block_k=block_k, k_fold=FOLD, prefetch_tiles=peel
            )
            fits = peel == 1 or peel * block_k <= k  # peeled tiles K holds
            if block_k >= FOLD and fits and cfg not in configs:
                configs.append(cfg)
    return configs


@triton.jit
def _norm_input(x_rows, r_rows, k, mask, HAS_RESIDUAL: tl.constexpr, dtype: tl.constexpr):
    """[BLOCK_M, BLOCK_K] float32 of x (+ residual, the sum rounded to ``dtype`` as HF's
    residual add rounds it), the rows the norm prologue normalizes."""
    h = tl.load(x_rows + k[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_rows + k[None, :], mask=mask, other=0.0).to(tl.float32)
        h = (h + r).to(dtype).to(tl.float32)
    return h


@triton.jit
def _x_tile(
    x_rows, r_rows, norm_w_ptr, rstd, k, m_mask, K,
    GATED: tl.constexpr, NORM: tl.constexpr, dtype: tl.constexpr,
):  # fmt: skip
    """x's [BLOCK_M, BLOCK_K] tile at columns ``k`` in ``dtype``, as the GEMM consumes it:
    loaded, normalized (NORM) or activated (GATED); zero where masked."""
    k_mask = k < K
    x_mask = m_mask[:, None] & k_mask[None, :]
    if NORM > 0:  # RMSNorm's rounding: normed rows, then the weight product
        h = _norm_input(x_rows, r_rows, k, x_mask, NORM == 2, dtype)
        nw = tl.load(norm_w_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
        x = rms_scale(h, rstd[:, None], nw[None, :], dtype)
    else:
        x = tl.load(x_rows + k[None, :], mask=x_mask, other=0.0)
    if GATED:  # padding stays zero: silu(0) * 0
        up = tl.load(x_rows + K + k[None, :], mask=x_mask, other=0.0)
        x = silu_mul_rounded(x.to(tl.float32), up.to(tl.float32), dtype)
    return x


@triton.jit
def _loop_x_tile(
    x_rows, r_rows, norm_w_ptr, rstd, k, m_mask, K,
    GATED: tl.constexpr, NORM: tl.constexpr, USE_DOT: tl.constexpr, dtype: tl.constexpr,
):  # fmt: skip
    """(x's tile as the loop multiplies it, its rows' sums of squares [BLOCK_M]): as
    ``_x_tile`` (the sums zero, unused) but for NORM >= 4, the deferred norm: x times the
    norm's weight in float32 (in ``dtype`` for tl.dot; NORM == 5: x alone, the weight
    being in the GEMM's), the sums of squares of x alone, so the statistics gather as the
    loop loads x and 1/rms scales the product at the end."""
    if NORM >= 4:
        k_mask = k < K
        h = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        h = h.to(tl.float32)
        x = h
        if NORM == 4:
            nw = tl.load(norm_w_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
            x = h * nw[None, :]
        if USE_DOT:
            x = x.to(dtype)
        return x, tl.sum(h * h, axis=1)
    else:
        x = _x_tile(x_rows, r_rows, norm_w_ptr, rstd, k, m_mask, K, GATED, NORM, dtype)
        return x, tl.zeros_like(rstd)


L2_MAX_PIECES = 16  # bulk prefetches per weight row at most, spread over the threads
L2_MIN_PIECE = 256  # bytes: a row's share below this is not worth an instruction


@triton.jit
def prefetch_rows_to_l2(
    w_ptr, cols, N, stride_wn, FIRST: tl.constexpr, NBYTES: tl.constexpr, PIECES: tl.constexpr
):
    """Ask L2 for ``NBYTES`` of each weight row ``cols`` from column ``FIRST`` on: a hint
    (``cp.async.bulk.prefetch.L2``, no registers held), in [BLOCK_N, PIECES] pieces of
    NBYTES // PIECES bytes (16-byte aligned: the launcher checks, see
    ``l2_prefetch_plan``). Rows past N prefetch row N - 1 again. Also the helper of
    ``bench/pdl_probe_gpu.py``'s L2 variant."""
    rows = tl.minimum(cols, N - 1).to(tl.int64)
    piece = NBYTES // PIECES
    elem = w_ptr.dtype.element_ty.primitive_bitwidth // 8
    starts = (rows[:, None] * stride_wn + FIRST) * elem + tl.arange(0, PIECES)[None, :] * piece
    ptrs = w_ptr.to(tl.pointer_type(tl.int8)) + starts  # [BLOCK_N, PIECES]
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
        "=r,l,r",
        [ptrs, tl.full(ptrs.shape, piece, tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _w_tile(w_rows, k, n_mask, K, W_EVICTION: tl.constexpr, W_CACHE: tl.constexpr):
    """The weight's [BLOCK_N, BLOCK_K] tile at columns ``k``; zero where masked."""
    return tl.load(
        w_rows + k[None, :],
        mask=n_mask[:, None] & (k < K)[None, :],
        other=0.0,
        eviction_policy=W_EVICTION,
        cache_modifier=W_CACHE,
    )


@triton.jit
def _accumulate(acc, x, w, USE_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """acc += x [BLOCK_M, BLOCK_K] times w [BLOCK_N, BLOCK_K]: into [BLOCK_M, BLOCK_N] by
    tl.dot, or elementwise into [BLOCK_M, BLOCK_N, BLOCK_K] (summed over K at the end: a
    reduction per step, warp shuffles, would cost more than the loads it follows)."""
    if USE_DOT:
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION, out_dtype=tl.float32)
    else:
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _program_columns(
    pid, BLOCK_N: tl.constexpr, ROW_ORDER: tl.constexpr, ORDER_WIDTH: tl.constexpr
):
    """The output columns [BLOCK_N] program ``pid`` computes (the kernel's ROW_ORDER):
    with an order, column j is what torch's thread ``pid`` adds in pass j // 4 into
    running sum j % 4."""
    j = tl.arange(0, BLOCK_N)
    if ROW_ORDER > 0:
        cols = thread_column(pid, j // 4, j % 4, ORDER_WIDTH, ROW_ORDER == 1)
    else:
        cols = pid * BLOCK_N + j
    return cols


@triton.jit
def _thread_sum_of_squares(h, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """h [BLOCK_M, BLOCK_N] float32 (zeros where masked), its columns in a ROW_ORDER
    program's order (pass j, running sum i at column 4 j + i) -> [BLOCK_M]: each row's
    sum of squares as torch's reduction thread adds those values (``_row_sum_order``):
    four running sums, pass after pass, each square rounded first, then added left to
    right."""
    PASSES: tl.constexpr = BLOCK_N // 4
    sq = tl.reshape(unfused(h * h), (BLOCK_M, PASSES, 4))
    j = tl.arange(0, PASSES)[None, :, None]
    acc = tl.zeros([BLOCK_M, 4], tl.float32)
    for p in tl.static_range(PASSES):  # picks out pass p exactly: the rest adds zeros
        acc += tl.sum(tl.where(j == p, sq, 0.0), axis=1)
    return left_to_right(acc)


@triton.jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    res_ptr,  # NORM == 2: [M, K] residual added to x before the norm
    norm_w_ptr,  # NORM > 0: [K] the norm's weight
    res_out_ptr,  # NORM == 2: [M, K] where program 0 stores x + residual
    tail_res_ptr,  # TAIL: [M, N] residual added to the product
    tail_w_ptr,  # TAIL: [N] the norm's weight
    tail_res_out_ptr,  # TAIL: [M, N] product + residual (may be tail_res_ptr)
    counter_ptr,  # TAIL == 1: int32 arrival counter, zero between launches
    stats_ptr,  # NORM == 3: [M, num_stats] partial sums of squares read; TAIL == 2: written
    trace_ptr,  # TRACE: int64 [programs, FIELDS] per-program timestamps (kernels/_trace.py)
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    stride_rm,
    stride_rom,
    stride_trm,
    stride_trom,
    stride_sm,
    num_stats,  # NORM == 3: columns of stats to sum (the producer's programs)
    eps,
    tail_eps,
    tail_inv_n,  # TAIL == 1: float32's 1 / N
    norm_inv_k,  # NORM == 3: float32's 1 / K
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    GATED: tl.constexpr,  # x rows hold gate then up, K each: x = silu(gate) * up
    NORM: tl.constexpr,  # 0: x as is; 1: rms_norm(x); 2: rms_norm(x + residual);
    # 3: rms_norm(x), its sum of squares that of stats' row; 4: rms_norm(x) deferred:
    # x * weight as it loads, the product scaled by each row's 1/rms at the end; 5: as 4,
    # the norm's weight already in w (``NormPrologue.weight`` None: x alone as it loads)
    PEEL: tl.constexpr,  # load the first PEEL (0-2) weight tiles before anything else
    PDL: tl.constexpr,  # launched with PDL: trigger dependents, wait after those tiles
    W_EVICTION: tl.constexpr,  # eviction_policy of the weight loads
    W_CACHE: tl.constexpr,  # their cache_modifier ("" or ".cg": past L1, which keeps x)
    # 1: out = rms_norm(product + residual), by the last program; 2: out = product +
    # residual (tail_res_out_ptr unused), each program's sum of squares of it into stats;
    # 3: out = product + residual alone (``then_residual``; may be in place)
    TAIL: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,  # TAIL == 1: next power of 2 of N; NORM == 3: of num_stats
    L2_BYTES: tl.constexpr = 0,  # PDL: bytes of each weight row after the PEEL tiles to L2
    L2_PIECES: tl.constexpr = 1,  # in this many bulk prefetches a row
    LOOKAHEAD: tl.constexpr = False,  # the loop loads a weight tile ahead (SkinnyConfig)
    SUM_WIDTH: tl.constexpr = 1,  # TAIL == 1: the norm's sum order (rmsnorm.row_norm_args)
    SUM_VECTOR: tl.constexpr = False,
    SUM_PASSES: tl.constexpr = 1,
    # TAIL == 2: 0, program p takes rows p * BLOCK_N on; else the rows torch's reduction
    # thread p adds (``stats_config``): 1 (vector order) 4 (p + W j) + i, 2 (strided)
    # p + W (4 j + i), for j < BLOCK_N / 4, i < 4, W = ORDER_WIDTH
    ROW_ORDER: tl.constexpr = 0,
    ORDER_WIDTH: tl.constexpr = 1,
    TRACE: tl.constexpr = False,  # store per-program timestamps into trace_ptr
):
    stamp(trace_ptr, START, TRACE)
    rows = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    cols = _program_columns(tl.program_id(0), BLOCK_N, ROW_ORDER, ORDER_WIDTH)  # [BLOCK_N]
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    m_mask = rows < M
    n_mask = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    dtype = x_ptr.dtype.element_ty
    if PDL:  # the next kernel may launch now: it waits for all of this one before reading
        tl.extra.cuda.gdc_launch_dependents()
    # weights are never written by other kernels: no need to wait for them
    if PEEL >= 1:
        w_first = _w_tile(w_rows, ks, n_mask, K, W_EVICTION, W_CACHE)
    if PEEL >= 2:
        w_second = _w_tile(w_rows, BLOCK_K + ks, n_mask, K, W_EVICTION, W_CACHE)
    if L2_BYTES > 0:
        prefetch_rows_to_l2(w_ptr, cols, N, stride_wn, PEEL * BLOCK_K, L2_BYTES, L2_PIECES)
    if PDL:  # everything below may read what the previous kernel wrote
        tl.extra.cuda.gdc_wait()
    stamp(trace_ptr, WAITED, TRACE)
    tile_mask = m_mask[:, None] & n_mask[None, :]
    if TAIL > 0:  # the residual, asked for now so that the last program does not wait for it
        r_tile = tail_res_ptr + rows.to(tl.int64)[:, None] * stride_trm + cols[None, :]
        tail_r = tl.load(r_tile, mask=tile_mask, other=0.0).to(tl.float32)
    if LOOKAHEAD:  # the loop's first tile: on its way from HBM while x comes from L2
        w_next = _w_tile(w_rows, PEEL * BLOCK_K + ks, n_mask, K, W_EVICTION, W_CACHE)
    r_rows = res_ptr + rows.to(tl.int64)[:, None] * stride_rm
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)  # stays unused without a norm
    if NORM == 3:
        if PEEL >= 1:  # the first tile's x and norm weight travel with the statistics
            first_mask = m_mask[:, None] & (ks < K)[None, :]
            first_h = tl.load(x_rows + ks[None, :], mask=first_mask, other=0.0)
            first_nw = tl.load(norm_w_ptr + ks, mask=ks < K, other=0.0)
        # the producer's partial sums (torch's thread sums), halved as torch halves them,
        # scaled as its mean scales; row by row, each read in slices (halved_sum_from)
        for m in tl.static_range(BLOCK_M):
            present = tl.where(m < M, num_stats, 0)
            row_sum = halved_sum_from(stats_ptr + m * stride_sm, present, BLOCK_TAIL)
            row_rstd = tl.rsqrt(unfused(row_sum * norm_inv_k) + eps)
            rstd = tl.where(rows == m, row_rstd, rstd)
    if (NORM == 1) or (NORM == 2):
        # Every program reads its rows whole once for the statistics (from L2 after the
        # first; K * M elements against its BLOCK_N * K of weight), as RMSNorm would.
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + ks
            mask = m_mask[:, None] & (k < K)[None, :]
            h = _norm_input(x_rows, r_rows, k, mask, NORM == 2, dtype)
            if NORM == 2:  # noqa: SIM102 (a compile-time branch around a run-time one)
                if tl.program_id(0) == 0:  # the new residual stream, written once
                    ro = res_out_ptr + rows.to(tl.int64)[:, None] * stride_rom + k[None, :]
                    tl.store(ro, h.to(dtype), mask=mask)
            sum_sq += tl.sum(h * h, axis=1)
        rstd = tl.rsqrt(sum_sq / K + eps)  # [BLOCK_M]
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    # the prefetched tiles first, then the rest: the same order of sums either way
    start = 0
    sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)  # NORM >= 4: x's, as the loop loads it
    if PEEL >= 1:
        if NORM == 3:  # loaded above: only normalized here, as _x_tile would
            x = rms_scale(
                first_h.to(tl.float32), rstd[:, None], first_nw.to(tl.float32)[None, :], dtype
            )
        else:
            x, sq = _loop_x_tile(
                x_rows, r_rows, norm_w_ptr, rstd, ks, m_mask, K, GATED, NORM, USE_DOT, dtype
            )
        if NORM >= 4:  # the other modes carry no sums through the loop
            sum_sq += sq
        acc = _accumulate(acc, x, w_first, USE_DOT, PRECISION)
        start = BLOCK_K
    if PEEL >= 2:
        k = BLOCK_K + ks
        x, sq = _loop_x_tile(
            x_rows, r_rows, norm_w_ptr, rstd, k, m_mask, K, GATED, NORM, USE_DOT, dtype
        )
        if NORM >= 4:
            sum_sq += sq
        acc = _accumulate(acc, x, w_second, USE_DOT, PRECISION)
        start = 2 * BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        k = k0 + ks
        if LOOKAHEAD:  # the next tile asked for before this one is used (none past K)
            w = w_next
            w_next = _w_tile(w_rows, k + BLOCK_K, n_mask, K, W_EVICTION, W_CACHE)
            x, sq = _loop_x_tile(
                x_rows, r_rows, norm_w_ptr, rstd, k, m_mask, K, GATED, NORM, USE_DOT, dtype
            )
        else:
            x, sq = _loop_x_tile(
                x_rows, r_rows, norm_w_ptr, rstd, k, m_mask, K, GATED, NORM, USE_DOT, dtype
            )
            w = _w_tile(w_rows, k, n_mask, K, W_EVICTION, W_CACHE)
        if NORM >= 4:
            sum_sq += sq
        acc = _accumulate(acc, x, w, USE_DOT, PRECISION)
    if not USE_DOT:
        acc = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]
    if NORM >= 4:
        acc = acc * tl.rsqrt(sum_sq / K + eps)[:, None]
    product = acc.to(out_ptr.dtype.element_ty)  # [BLOCK_M, BLOCK_N], rounded as stored
    stamp(trace_ptr, WORKED, TRACE)
    if TAIL == 2:
        # HF's residual add, stored in place, and this program's share of the statistics
        h = (product.to(tl.float32) + tail_r).to(dtype)
        out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(out, h, mask=tile_mask)
        hf = tl.where(tile_mask, h.to(tl.float32), 0.0)
        s_out = stats_ptr + rows.to(tl.int64) * stride_sm + tl.program_id(0)
        tl.store(s_out, _thread_sum_of_squares(hf, BLOCK_M, BLOCK_N), mask=m_mask)
    elif TAIL == 3:  # HF's residual add alone, in place or not
        h = (product.to(tl.float32) + tail_r).to(dtype)
        out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(out, h, mask=tile_mask)
    elif TAIL == 1:
        # HF's residual add: the stored product plus the residual, rounded
        h = (product.to(tl.float32) + tail_r).to(dtype)
        h_rows = tail_res_out_ptr + rows.to(tl.int64)[:, None] * stride_trom
        tl.store(h_rows + cols[None, :], h, mask=tile_mask)
        # The barrier orders every thread's stores before the (single-thread) release;
        # the acquire makes the other programs' sums visible to the last arrival.
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
        if arrived == tl.num_programs(0) - 1:
            _norm_rows(
                tail_res_out_ptr, stride_trom, tail_w_ptr, out_ptr, stride_om, M, N,
                tail_inv_n, tail_eps, BLOCK_TAIL, SUM_WIDTH, SUM_VECTOR, SUM_PASSES,
            )  # fmt: skip
            tl.store(counter_ptr, 0)  # every program has arrived: ready for the next launch
    else:
        out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(out, product, mask=tile_mask)
    stamp(trace_ptr, END, TRACE)


@triton.jit
def _folded_w_tile(w_rows, k, n_mask, K, W_EVICTION: tl.constexpr, W_CACHE: tl.constexpr):
    """The weight's tile at columns ``k`` [KK, F] of rows ``w_rows`` [BLOCK_N, 1, 1]:
    [BLOCK_N, KK, F], zero where masked."""
    return tl.load(
        w_rows + k[None, :, :],
        mask=n_mask[:, None, None] & (k < K)[None, :, :],
        other=0.0,
        eviction_policy=W_EVICTION,
        cache_modifier=W_CACHE,
    )


@triton.jit
def _folded_x_tile(x_ptr, k, K, GATED: tl.constexpr, dtype: tl.constexpr):
    """x's one row at columns ``k`` [KK, F], in ``dtype``, activated (GATED) as
    ``_x_tile`` activates it; zero where masked."""
    x = tl.load(x_ptr + k, mask=k < K, other=0.0)
    if GATED:  # padding stays zero: silu(0) * 0
        up = tl.load(x_ptr + K + k, mask=k < K, other=0.0)
        x = silu_mul_rounded(x.to(tl.float32), up.to(tl.float32), dtype)
    return x


@triton.jit
def _folded_squares(x):
    """x [KK, F]'s squares in float32, each thread's F neighbours added: [KK] (running
    sums of the accumulator's size, not the tile's: registers are this kernel's pace)."""
    xf = x.to(tl.float32)
    return tl.sum(xf * xf, axis=1)


@triton.jit
def _folded_accumulate(acc, x, w):
    """acc [BLOCK_N, KK] += the products of x [KK, F] and w [BLOCK_N, KK, F], each
    thread's F neighbours (one vector load) added first, in registers. (Three
    dimensions, as the loads: a fourth, for more rows of x, makes Triton move every
    tile through shared memory to another layout.)"""
    return acc + tl.sum(x.to(tl.float32)[None, :, :] * w.to(tl.float32), axis=2)


@triton.jit
def _folded_skinny_kernel(
    x_ptr,  # [1, K] ([1, 2K] gated)
    w_ptr,
    out_ptr,
    res_ptr,  # RESIDUAL: [1, N] added to the product (may be out_ptr)
    trace_ptr,  # TRACE: int64 [programs, FIELDS] per-program timestamps (kernels/_trace.py)
    N,
    K,
    stride_wn,
    eps,  # DEFERRED: the norm's epsilon
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FOLD: tl.constexpr,  # F: neighbouring products a thread adds at each K step
    GATED: tl.constexpr,  # x holds gate then up, K each: x = silu(gate) * up
    PEEL: tl.constexpr,  # weight tiles loaded before anything else (0-2)
    PDL: tl.constexpr,  # launched with PDL: trigger dependents, wait after the PEEL tiles
    W_EVICTION: tl.constexpr,
    W_CACHE: tl.constexpr,
    TRACE: tl.constexpr = False,
    DEFERRED: tl.constexpr = False,  # the product scaled by 1/rms(x) (norm weight in w)
    RESIDUAL: tl.constexpr = False,  # out = product + residual, rounded as HF's add
    PAIRS: tl.constexpr = False,  # w is gate then up (N = 2I rows): out = silu(gate) * up [I]
):
    """One row of x times the weight (plain or gated x), as ``_skinny_gemm_kernel``
    computes it on the sum path, program by program and tile by tile, but with the K axis
    of a tile split into [BLOCK_K / F, F] (``SkinnyConfig.k_fold``): each thread adds the
    F products of its vector load at once, so the running sums are [BLOCK_N, BLOCK_K / F].
    DEFERRED: x is an RMSNorm's input whose weight the GEMM's weight holds (NORM == 5 of
    the tile kernel): x's sum of squares gathers as it loads ([KK] running sums, each
    thread's F squares added first, as the products), 1/rms scales the float32 product.
    PAIRS: the weight's rows are a gated MLP's gate [0, I) then up [I, 2I); the program's
    BLOCK_N rows are BLOCK_N / 2 pairs (gate row j, up row I + j) and it stores the pairs'
    ``silu(gate) * up`` (each rounded as stored first) at columns j of out [1, I]."""
    stamp(trace_ptr, START, TRACE)
    KK: tl.constexpr = BLOCK_K // FOLD
    ks = tl.arange(0, KK)[:, None] * FOLD + tl.arange(0, FOLD)[None, :]  # [KK, F]
    if PAIRS:
        half = N // 2  # I
        lane = tl.arange(0, BLOCK_N)
        pair = tl.program_id(0) * (BLOCK_N // 2) + lane // 2  # [BLOCK_N]: j, j, j+1, j+1, ...
        rows = pair + (lane % 2) * half  # [BLOCK_N]: gate j, up j, gate j+1, up j+1, ...
        n_mask = pair < half
    else:
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        n_mask = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None, None] * stride_wn  # [BLOCK_N, 1, 1]
    dtype = x_ptr.dtype.element_ty
    if PDL:  # the next kernel may launch now: it waits for all of this one before reading
        tl.extra.cuda.gdc_launch_dependents()
    # weights are never written by other kernels: no need to wait for them
    if PEEL >= 1:
        w_first = _folded_w_tile(w_rows, ks, n_mask, K, W_EVICTION, W_CACHE)
    if PEEL >= 2:
        w_second = _folded_w_tile(w_rows, BLOCK_K + ks, n_mask, K, W_EVICTION, W_CACHE)
    if PDL:  # everything below may read what the previous kernel wrote
        tl.extra.cuda.gdc_wait()
    stamp(trace_ptr, WAITED, TRACE)
    if RESIDUAL:  # asked for now, so that the end does not wait for it
        residual = tl.load(res_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_N, KK], dtype=tl.float32)
    squares = tl.zeros([KK], dtype=tl.float32)  # DEFERRED: x's, as it loads
    start = 0  # the prefetched tiles first, then the rest: the same order of sums either way
    if PEEL >= 1:
        x = _folded_x_tile(x_ptr, ks, K, GATED, dtype)
        if DEFERRED:
            squares += _folded_squares(x)
        acc = _folded_accumulate(acc, x, w_first)
        start = BLOCK_K
    if PEEL >= 2:
        x = _folded_x_tile(x_ptr, BLOCK_K + ks, K, GATED, dtype)
        if DEFERRED:
            squares += _folded_squares(x)
        acc = _folded_accumulate(acc, x, w_second)
        start = 2 * BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        x = _folded_x_tile(x_ptr, k0 + ks, K, GATED, dtype)
        if DEFERRED:
            squares += _folded_squares(x)
        acc = _folded_accumulate(
            acc, x, _folded_w_tile(w_rows, k0 + ks, n_mask, K, W_EVICTION, W_CACHE)
        )
    total = tl.sum(acc, axis=1)  # [BLOCK_N] float32
    if DEFERRED:
        total = total * tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    product = total.to(out_ptr.dtype.element_ty)  # rounded as stored
    if RESIDUAL:
        product = (product.to(tl.float32) + residual).to(out_ptr.dtype.element_ty)
    stamp(trace_ptr, WORKED, TRACE)
    if PAIRS:  # [BLOCK_N] gate, up, gate, up, ... -> [BLOCK_N / 2] activated
        gate, up = tl.split(tl.reshape(product, [BLOCK_N // 2, 2]))
        act = silu_mul_rounded(gate.to(tl.float32), up.to(tl.float32), out_ptr.dtype.element_ty)
        pairs = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out_ptr + pairs, act, mask=pairs < half)
    else:
        tl.store(out_ptr + rows, product, mask=n_mask)
    stamp(trace_ptr, END, TRACE)


@triton.jit
def _norm_rows(
    h_ptr, stride_h, w_ptr, out_ptr, stride_o, M, N, inv_n, eps, BLOCK: tl.constexpr,
    SUM_WIDTH: tl.constexpr, SUM_VECTOR: tl.constexpr, SUM_PASSES: tl.constexpr,
):  # fmt: skip
    """out[m] = weight * rms_norm(h[m]) for the M rows of h [M, N], rounded and summed as
    ``kernels.rmsnorm`` rounds and sums (torch's order for a launch of M rows)."""
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    dtype = out_ptr.dtype.element_ty
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    for m in range(0, M):  # m * stride: at most 16 rows of one row's width, no overflow
        h_row = h_ptr + m * stride_h
        x = tl.load(h_row + cols, mask=mask, other=0.0).to(tl.float32)
        normed = rms_norm_row(
            x, h_row, w, N, inv_n, eps, dtype, SUM_WIDTH, SUM_VECTOR, SUM_PASSES
        )  # fmt: skip
        tl.store(out_ptr + m * stride_o + cols, normed, mask=mask)


def can_use(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when ``skinny_linear(x, weight)`` applies: x [M <= MAX_M, K] and weight [N, K]
    both contiguous, of one supported dtype, on CUDA (or on CPU under Triton's
    interpreter, ``TRITON_INTERPRET=1``)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        return False
    if not 1 <= x.shape[0] <= MAX_M:
        return False
    if x.dtype != weight.dtype or x.dtype not in _DTYPES or x.device != weight.device:
        return False
    if not (x.is_contiguous() and weight.is_contiguous()):
        return False
    if x.device.type == "cuda":
        return True
    return x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class NormEpilogue:
    """An RMSNorm run on the GEMM's output inside its kernel (``skinny_linear(then_norm=
    ...)``): the product, rounded, plus ``residual`` (rounded as HF's residual add) is
    stored into ``residual_out`` (may be ``residual`` itself: each element is read and
    written by one program), and the output is the norm of that sum, computed by the last
    program to finish (an arrival counter, ``kernels/_arrivals.py``) with
    ``kernels.rmsnorm``'s rounding; its statistics are summed in this program's order, so
    a normalized element may round to its neighbour."""

    weight: torch.Tensor  # [N] the norm's weight
    eps: float
    residual: torch.Tensor  # [M, N]
    residual_out: torch.Tensor  # [M, N]


@dataclass(frozen=True)
class ResidualStats:
    """The first half of an RMSNorm split between two GEMMs (``skinny_linear(then_stats=
    ...)``): the output is the product, rounded, plus ``residual`` (rounded as HF's
    residual add; ``out`` may be ``residual`` itself), and each program stores its float32
    sum of squares of its columns of that sum into ``stats`` [M, programs]
    (``stats_columns``). The producer launches with ``stats_config``'s tile: program p
    computes the columns that thread p of torch's reduction adds, and sums their squares
    as that thread does; the next GEMM finishes the norm as it loads its input
    (``NormPrologue(stats=...)``), adding the programs' sums as torch adds its threads'.
    So the norm is ``kernels.rmsnorm``'s to the bit, nobody reads a whole row, and nobody
    waits for the last program."""

    residual: torch.Tensor  # [M, N]
    stats: torch.Tensor  # [M, stats_columns(N, M)] float32


@dataclass(frozen=True)
class NormPrologue:
    """An RMSNorm run on x inside the GEMM (``skinny_linear(norm=...)``), rounded as
    ``kernels.rmsnorm`` rounds it: with ``residual``, ``x + residual`` (rounded) is
    normalized and stored into ``residual_out`` (a buffer of its own: the programs still
    read ``residual`` while one of them writes). With ``stats`` (no residual then), x is
    a ``ResidualStats`` output and its sum of squares the sum of ``stats``' row, added
    in torch's order, so no program reads x twice. With ``deferred`` (no residual, no
    stats), the norm moves past the product: x times the weight as it loads, the product
    scaled by each row's 1/rms, whose sum of squares gathers in the same loads, so
    nothing is read before the loop; the normalized x is never rounded (HF rounds it
    twice), so an output may differ from the rounded path's by about a bf16 ulp of it.
    A deferred norm's ``weight`` may be None: the GEMM's weight already holds it
    (``layers.norm.fold_norm_weight``), so x loads as it is."""

    weight: torch.Tensor | None  # [K] the norm's weight
    eps: float
    residual: torch.Tensor | None = None  # [M, K]
    residual_out: torch.Tensor | None = None  # [M, K], not residual's storage
    stats: torch.Tensor | None = None  # [M, P] float32 partial sums of squares of x's rows
    deferred: bool = False  # 1/rms applied to the product (float32), not to x


def stats_columns(n: int, m: int) -> int:
    """Columns of a ``ResidualStats.stats`` for an output [m, n]: one per program, as many
    as torch's reduction of such rows has threads a row."""
    return torch_row_sum_order(n, m).width


def stats_config(config: SkinnyConfig, n: int, m: int) -> SkinnyConfig | None:
    """``config`` as a ``ResidualStats`` producer of an output [m, n] launches it: each
    program computes the rows one thread of torch's reduction adds (``_row_sum_order``),
    4 a pass, so BLOCK_N is 4 x passes, and BLOCK_K shrinks where needed to keep the
    tile's area. None where those rows are not a power of 2 or above the kernel's
    largest BLOCK_N (wide rows at many rows: torch's threads then add more each)."""
    block_n = 4 * torch_row_sum_order(n, m).passes
    if block_n > _MAX_BLOCK_N or block_n & (block_n - 1):
        return None
    block_k = max(_MIN_BLOCK_K, min(config.block_k, config.block_n * config.block_k // block_n))
    return dataclasses.replace(config, block_n=block_n, block_k=block_k)


def skinny_linear(
    x: torch.Tensor,  # [M, K] ([M, 2K] gate then up when gated), M <= MAX_M
    weight: torch.Tensor,  # [N, K], unit stride on K
    out: torch.Tensor | None = None,  # [M, N] in x's dtype
    *,
    config: SkinnyConfig | None = None,  # launch parameters; pick_config's by default
    gated: bool = False,  # x is a gated MLP's gate_up: multiply by silu(gate) * up
    norm: NormPrologue | None = None,  # multiply by rms_norm(x [+ residual]) instead
    then_norm: NormEpilogue | None = None,  # return rms_norm(product + residual) instead
    then_stats: ResidualStats | None = None,  # return product + residual, and its statistics
    then_residual: torch.Tensor | None = None,  # [M, N] return product + this (may be out)
) -> torch.Tensor:  # [M, N] in x's dtype ([M, N / 2] where ``config.activates``)
    """``x @ weight.T`` accumulated in float32, rounded once to x's dtype; with ``gated``,
    ``silu_and_mul(x) @ weight.T``, the activation computed as the weight streams in and
    rounded as ``kernels.activation.silu_and_mul`` rounds it (same bits as that kernel
    followed by this one, one launch fewer); with ``norm``, ``rms_norm(x) @ weight.T``
    (:class:`NormPrologue`; from ``stats`` the statistics are ``kernels.rmsnorm``'s to
    the bit, otherwise summed in another order, so a normalized element may round to its
    neighbour); with ``then_norm``, the RMSNorm of the product plus a residual
    (:class:`NormEpilogue`); with ``then_stats``, the product plus a residual and its
    statistics (:class:`ResidualStats`, launched on ``stats_config``'s tile, whose
    partial sums a ``NormPrologue(stats=...)`` of the next GEMM reads); with
    ``then_residual``, the product plus it (HF's residual add, rounded; ``out`` may be
    ``then_residual`` itself: each element is read and written by one program); with a
    ``config`` that ``activates`` (the folded kernel, one row), weight is a gated MLP's
    gate then up and the output ``silu(gate) * up`` of the product's halves, [M, N / 2].
    Raises ``ValueError`` for M > MAX_M, mismatched shapes or dtypes, or a non-unit last
    stride. Never syncs with the host, so it can be captured in a CUDA graph."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"x and weight must be 2-D, got {x.dim()}-D and {weight.dim()}-D")
    m, width = x.shape
    k = width // 2 if gated else width
    n = weight.shape[0]
    activates = config is not None and config.activates
    if activates and (n % 2 or config.block_n % 2 or config.k_fold == 1):
        raise ValueError(
            f"an activating launch takes a folded config of whole pairs of rows "
            f"(even BLOCK_N and N), got BLOCK_N={config.block_n}, N={n}, "
            f"k_fold={config.k_fold}"
        )
    n_out = n // 2 if activates else n
    if m > MAX_M:
        raise ValueError(f"skinny_linear takes at most {MAX_M} rows, got {m}")
    if weight.shape[1] != k or (gated and width != 2 * k):
        raise ValueError(f"weight {tuple(weight.shape)} does not match x's width {width}")
    if x.dtype not in _DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"dtypes x={x.dtype} weight={weight.dtype}: want one of {_DTYPES}")
    check_last_dim_contiguous("x", x)
    check_last_dim_contiguous("weight", weight)
    if out is None:
        out = torch.empty(m, n_out, dtype=x.dtype, device=x.device)
    elif out.shape != (m, n_out) or out.dtype != x.dtype:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} != ({m}, {n_out}) {x.dtype}")
    check_last_dim_contiguous("out", out)
    residual, residual_out, norm_weight = x, x, x  # placeholders when there is no norm
    stats = out  # placeholder without statistics
    if norm is not None:
        if gated:
            raise ValueError("a norm prologue and a gated x exclude each other")
        norm_weight, residual, residual_out = _checked_norm(norm, x)
        if norm.stats is not None:
            stats = norm.stats
    tail_res, tail_w, tail_res_out, counter = out, out, out, out  # placeholders
    extras = (norm, then_norm, then_stats, then_residual)
    if sum(extra is not None for extra in extras) > 1:
        raise ValueError("norm, then_norm, then_stats and then_residual exclude each other")
    if then_norm is not None:
        tail_w, tail_res, tail_res_out = _checked_tail(then_norm, out)
    if then_stats is not None:
        tail_res, stats = then_stats.residual, then_stats.stats
        _check_like_rows("residual", tail_res, out)
    if then_residual is not None:
        tail_res = then_residual
        _check_like_rows("residual", tail_res, out)
    if m == 0 or n == 0:
        return out
    cfg = config or pick_config(m, n, k)
    if cfg.block_m < m:
        raise ValueError(f"config block_m={cfg.block_m} < {m} rows")
    if cfg.k_fold > 1:
        if then_norm is not None or then_stats is not None:
            raise ValueError("a k_fold config takes no folded norm")
        if norm is not None and norm.weight is not None:
            raise ValueError("a k_fold config takes only a norm whose weight is in the GEMM's")
        if activates and (gated or then_residual is not None):
            raise ValueError("an activating launch takes no gated x and adds no residual")
        eps = norm.eps if norm is not None else None
        return _folded_linear(x, weight, out, cfg, gated, eps, then_residual)
    grid, row_order = cfg.grid(n), {}
    if then_stats is not None:
        order = torch_row_sum_order(n, m)
        if cfg.block_n != 4 * order.passes:
            raise ValueError(
                f"a ResidualStats producer of [{m}, {n}] takes {4 * order.passes} rows a "
                f"program (stats_config), got block_n={cfg.block_n}"
            )
        _check_stats(stats, m, order.width)
        grid, row_order = (order.width,), _row_order_args(order)
    if then_norm is not None:
        counter = arrival_counters(COUNTERS, x.device, 1)
    num_stats, norm_inv_k = 1, 0.0
    if norm is not None and norm.stats is not None:
        num_stats = stats_columns(k, m)
        if norm.stats.shape[1] != num_stats:
            raise ValueError(f"stats {tuple(norm.stats.shape)}: want {num_stats} columns a row")
        norm_inv_k = row_norm_args(k, m)[0]
    tail_inv_n, sum_order = row_norm_args(n, m) if then_norm is not None else (0.0, {})
    launch = pdl_launch(cfg.pdl, x.device)
    trace, traced = trace_slot(f"gemv {n}x{k}{' gated' if gated else ''}", grid[0], out)
    l2_row_bytes, l2_pieces = l2_prefetch_plan(cfg, weight) if launch["PDL"] else (0, 1)
    _skinny_gemm_kernel[grid](
        x,
        weight,
        out,
        residual,
        norm_weight,
        residual_out,
        tail_res,
        tail_w,
        tail_res_out,
        counter,
        stats,
        trace,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        residual.stride(0),
        residual_out.stride(0),
        tail_res.stride(0),
        tail_res_out.stride(0),
        stats.stride(0),
        num_stats,
        norm.eps if norm is not None else 0.0,
        then_norm.eps if then_norm is not None else 0.0,
        tail_inv_n,
        norm_inv_k,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        USE_DOT=cfg.use_dot,
        PRECISION=dot_precision(x.dtype),
        GATED=gated,
        NORM=_norm_mode(norm),
        PEEL=cfg.prefetch_tiles if cfg.pdl else 0,  # elsewhere than on CUDA only the order
        W_EVICTION=cfg.weight_eviction,
        W_CACHE=cfg.weight_cache,
        TAIL=_tail_mode(then_norm, then_stats, then_residual),
        BLOCK_TAIL=next_power_of_2(n if then_norm is not None else num_stats),
        L2_BYTES=l2_row_bytes,
        L2_PIECES=l2_pieces,
        LOOKAHEAD=cfg.lookahead,
        TRACE=traced,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **sum_order,
        **row_order,
        **launch,
    )
    return out


def _folded_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    cfg: SkinnyConfig,
    gated: bool,
    deferred_eps: float | None = None,  # a deferred norm's epsilon (its weight in ``weight``)
    residual: torch.Tensor | None = None,  # [1, N] added to the product (``then_residual``)
) -> torch.Tensor:
    """``skinny_linear``'s product by ``_folded_skinny_kernel`` (inputs already checked).
    Raises ``ValueError`` for a config it cannot run: the dot path, a fold that is not a
    power of 2 dividing BLOCK_K, or what only the tile kernel does (lookahead, an L2
    prefetch), which would otherwise be dropped without a word."""
    fold = cfg.k_fold
    if x.shape[0] != 1 or cfg.use_dot or fold & (fold - 1) or cfg.block_k % fold:
        raise ValueError(
            f"k_fold={fold} takes one row on the sum path, a power of 2 dividing BLOCK_K"
        )
    if cfg.lookahead or cfg.l2_prefetch_bytes:
        raise ValueError("a k_fold config takes no lookahead and no L2 prefetch")
    n, k = weight.shape
    grid = cfg.grid(n)
    launch = pdl_launch(cfg.pdl, x.device)
    trace, traced = trace_slot(f"gemv {n}x{k}{' gated' if gated else ''}", grid[0], out)
    _folded_skinny_kernel[grid](
        x, weight, out, residual if residual is not None else out, trace, n, k,
        weight.stride(0), deferred_eps or 0.0,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, FOLD=fold,
        GATED=gated, PEEL=cfg.prefetch_tiles if launch["PDL"] else 0,
        W_EVICTION=cfg.weight_eviction, W_CACHE=cfg.weight_cache, TRACE=traced,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, DEFERRED=deferred_eps is not None,
        RESIDUAL=residual is not None, PAIRS=cfg.activates, **launch,
    )  # fmt: skip
    return out


def _row_order_args(order: RowSumOrder) -> dict:
    """The kernel's ROW_ORDER and ORDER_WIDTH for a producer whose programs follow
    ``order``'s threads."""
    return dict(ROW_ORDER=1 if order.vector else 2, ORDER_WIDTH=order.width)


def l2_prefetch_plan(cfg: SkinnyConfig, weight: torch.Tensor) -> tuple[int, int]:
    """(bytes a row, bulk prefetches a row) that a PDL launch with ``cfg`` asks L2 for, of
    the weight [N, K]: ``cfg.l2_prefetch_bytes`` shared evenly by the N rows, clamped to
    what a row holds after the tiles loaded before the wait, in the most pieces (up to
    ``L2_MAX_PIECES``) of at least ``L2_MIN_PIECE`` bytes, rounded down to a multiple of
    16 bytes a piece. (0, 1): nothing, without PDL, where a row's share is below one
    piece, or where rows or pieces would not be 16-byte aligned (the bulk prefetch needs
    it)."""
    if not cfg.pdl or cfg.l2_prefetch_bytes <= 0:  # without PDL the program never waits
        return 0, 1
    n, k = weight.shape
    elem = weight.element_size()
    first = cfg.prefetch_tiles * cfg.block_k
    share = min(cfg.l2_prefetch_bytes // n, max(0, k - first) * elem)
    if share < L2_MIN_PIECE:
        return 0, 1
    pieces = min(L2_MAX_PIECES, 1 << (share // L2_MIN_PIECE).bit_length() - 1)
    row_bytes = share // (16 * pieces) * 16 * pieces
    aligned = weight.data_ptr() % 16 == 0 and (weight.stride(0) * elem) % 16 == 0
    return (row_bytes, pieces) if aligned and (first * elem) % 16 == 0 else (0, 1)


def _norm_mode(norm: NormPrologue | None) -> int:
    """The kernel's NORM for a prologue: 0 none, 1 x alone, 2 x + residual, 3 from stats,
    4 deferred, 5 deferred with its weight in the GEMM's."""
    if norm is None:
        return 0
    if norm.deferred:
        return 4 if norm.weight is not None else 5
    if norm.stats is not None:
        return 3
    return 1 if norm.residual is None else 2


def _tail_mode(
    then_norm: NormEpilogue | None,
    then_stats: ResidualStats | None,
    then_residual: torch.Tensor | None,
) -> int:
    """The tile kernel's TAIL: 0 the product, 1 its norm, 2 plus a residual with
    statistics, 3 plus a residual alone."""
    if then_norm is not None:
        return 1
    if then_stats is not None:
        return 2
    return 3 if then_residual is not None else 0


def _check_stats(stats: torch.Tensor, m: int, columns: int) -> None:
    """Raise ``ValueError`` unless ``stats`` is a float32 [m, >= columns] with unit stride."""
    if stats.dtype != torch.float32 or stats.dim() != 2:
        raise ValueError(f"stats must be a 2-D float32 tensor, got {stats.dtype} {stats.dim()}-D")
    if stats.shape[0] != m or stats.shape[1] < columns:
        raise ValueError(f"stats {tuple(stats.shape)} cannot hold ({m}, {columns})")
    check_last_dim_contiguous("stats", stats)


def _checked_tail(
    then_norm: NormEpilogue, out: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight, residual, residual_out) to launch with, checked against out [M, N]."""
    _check_norm_pair(then_norm.weight, then_norm.residual, then_norm.residual_out, out, "N")
    return then_norm.weight, then_norm.residual, then_norm.residual_out


def _checked_norm(
    norm: NormPrologue, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight, residual, residual_out) to launch with; x's own buffer stands in for the
    residual pair when there is none (the kernel then never reads or writes it)."""
    if (norm.residual is None) != (norm.residual_out is None):
        raise ValueError("residual and residual_out come together")
    if norm.deferred and (norm.residual is not None or norm.stats is not None):
        raise ValueError("a deferred norm takes x already summed: no residual, no stats")
    if norm.weight is None:
        if not norm.deferred:
            raise ValueError("only a deferred norm may leave its weight to the GEMM's")
        return x, x, x  # x stands in for the weight too: the kernel never reads it
    _check_norm_pair(norm.weight, norm.residual, norm.residual_out, x, "x's K")
    if norm.stats is not None:
        if norm.residual is not None:
            raise ValueError("a norm from stats takes x already summed: no residual")
        _check_stats(norm.stats, x.shape[0], 1)
    if norm.residual is None:
        return norm.weight, x, x
    if norm.residual_out.data_ptr() == norm.residual.data_ptr():
        raise ValueError("residual_out must not share residual's storage")
    return norm.weight, norm.residual, norm.residual_out


def _check_norm_pair(
    weight: torch.Tensor,  # [D] the norm's weight
    residual: torch.Tensor | None,  # [M, D], with residual_out, or neither
    residual_out: torch.Tensor | None,
    rows: torch.Tensor,  # [M, D]: the rows normalized (x, or the output)
    what: str,  # what D is called in messages
) -> None:
    """Raise ``ValueError`` unless a folded norm's tensors fit ``rows``."""
    d = rows.shape[1]
    if weight.shape != (d,) or weight.device != rows.device:
        raise ValueError(f"norm weight {tuple(weight.shape)} does not match {what}={d}")
    check_last_dim_contiguous("norm weight", weight)
    for name, t in (("residual", residual), ("residual_out", residual_out)):
        if t is not None:
            _check_like_rows(name, t, rows)


def _check_like_rows(name: str, t: torch.Tensor, rows: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``t`` has ``rows``' shape and dtype and unit last stride."""
    if t.shape != rows.shape or t.dtype != rows.dtype:
        raise ValueError(
            f"{name} {tuple(t.shape)} {t.dtype} != rows {tuple(rows.shape)} {rows.dtype}"
        )
    check_last_dim_contiguous(name, t)
