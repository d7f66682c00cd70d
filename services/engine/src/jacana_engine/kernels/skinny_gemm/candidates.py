"""The launch configs the decode-GEMM tuner times per shape (``candidate_configs``).

``pick_config`` is a rule of thumb; at start-up ``tuning.decode_gemm`` times these few
alternatives on the model's own weights and keeps the fastest (at one row on an H200
another tile beat pick_config's on every Qwen3 shape, mostly a narrower or deeper one).
"""

from __future__ import annotations

import dataclasses

from jacana_engine.kernels._common import next_power_of_2
from jacana_engine.kernels.skinny_gemm.config import (
    FOLD,
    MAX_BLOCK_N,
    MIN_BLOCK_K,
    SUM_PRODUCTS,
    SkinnyConfig,
    pick_config,
)

# one-row candidates: tiles of 4096 or 8192 weight elements, BLOCK_K of 512-2048, the
# families of the winner or runner-up of a launch sweep on every Qwen3 shape
ONE_ROW_TILES = (SUM_PRODUCTS // 2, SUM_PRODUCTS)
ONE_ROW_BLOCK_KS = (512, 1024, 2048)
MIN_CANDIDATE_BLOCK_N = 2
# the folded kernel's larger tiles: its fewer registers make room for them
FOLDED_TILE = 2 * SUM_PRODUCTS
# ... and rows whole, one tile a program (BLOCK_N 1 or 2), up to this K (its power of 2):
# with PDL a resident program then holds all of its weight before the wait
WHOLE_ROW_MAX_K = 4096


def candidate_configs(
    m: int, n: int, k: int, *, pdl: bool = False, folded: bool = False, activating: bool = False
) -> list[SkinnyConfig]:
    """Launch configs worth timing for x [m, k] @ weight[n, k].T, ``pick_config``'s first,
    no duplicates, each with BLOCK_K <= max(32, next_power_of_2(k)).

    One row (6-9 configs): every BLOCK_N x BLOCK_K tile of 4096 or 8192 elements with
    BLOCK_K in {512, 1024, 2048} (capped by K; BLOCK_N >= 2 and <= N's power of two), and
    where K's power of two is above 2048 and at most ``WHOLE_ROW_MAX_K``, whole rows of
    it (BLOCK_N 1 and 2). More rows on the sum path: one alternative, pick_config's tile
    half as wide and twice as deep (same registers per thread). The dot path:
    pick_config's alone (its tile already sits at the shared-memory budget and BLOCK_N
    floor). With ``pdl`` each comes twice, without and with programmatic dependent
    launch, and at one row the dependent ones once more with two weight tiles prefetched
    (where K holds more than two), and once more with ``lookahead`` (where K holds more
    than the one tile prefetched). With ``folded`` and ``pdl`` (one row), every dependent
    one-row tile once more on the folded kernel (``k_fold`` ``FOLD``), and the tiles of
    ``FOLDED_TILE`` elements too; with ``activating`` too (the weight is a gated MLP's
    gate then up, N even), each of those of whole pairs of rows (BLOCK_N even) once more,
    activating (its output is then [1, N / 2])."""
    picked = pick_config(m, n, k)
    k_cap = max(MIN_BLOCK_K, next_power_of_2(k))
    n_cap = min(MAX_BLOCK_N, max(MIN_CANDIDATE_BLOCK_N, next_power_of_2(n)))
    tiles: list[tuple[int, int]] = []  # (BLOCK_N, BLOCK_K)
    if m == 1:
        for area in ONE_ROW_TILES:
            for block_k in ONE_ROW_BLOCK_KS:
                block_k = min(block_k, k_cap)
                tiles.append((max(MIN_CANDIDATE_BLOCK_N, min(n_cap, area // block_k)), block_k))
        if max(ONE_ROW_BLOCK_KS) < k_cap <= WHOLE_ROW_MAX_K:
            tiles += [(1, k_cap), (min(2, n_cap), k_cap)]
    elif not picked.use_dot and picked.block_k * 2 <= k_cap:
        tiles.append((max(MIN_CANDIDATE_BLOCK_N, picked.block_n // 2), picked.block_k * 2))
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
    of 1024 and 2048, capped by K), no duplicates."""
    k_cap = max(MIN_BLOCK_K, next_power_of_2(k))
    n_cap = min(MAX_BLOCK_N, max(MIN_CANDIDATE_BLOCK_N, next_power_of_2(n)))
    larger = [
        (max(MIN_CANDIDATE_BLOCK_N, min(n_cap, FOLDED_TILE // min(bk, k_cap))), min(bk, k_cap))
        for bk in (1024, 2048)
    ]
    base = dependent[0]
    configs: list[SkinnyConfig] = []
    for block_n, block_k in [(c.block_n, c.block_k) for c in dependent] + larger:
        cfg = dataclasses.replace(base, block_n=block_n, block_k=block_k, k_fold=FOLD)
        if block_k >= FOLD and cfg not in configs:
            configs.append(cfg)
    return configs
