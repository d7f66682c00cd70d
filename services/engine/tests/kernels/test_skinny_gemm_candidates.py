"""The skinny GEMM's launch configs: ``pick_config``'s rule and the tuner's candidates
(``kernels/skinny_gemm/{config,candidates}.py``); no kernel runs here."""

from __future__ import annotations

import dataclasses

from skinny_cases import CANDIDATE_SHAPES, QWEN3_SHAPES

from jacana_engine.kernels._common import next_power_of_2
from jacana_engine.kernels.skinny_gemm import (
    FOLD,
    candidate_configs,
    pick_config,
)


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


def test_pick_config_fills_the_gpu():
    for k, n in QWEN3_SHAPES.values():
        for m in (1, 2, 4, 8, 16):
            cfg = pick_config(m, n, k)
            assert cfg.block_m >= m and cfg.use_dot == (m >= 16)
            programs = cfg.grid(n)[0]
            assert programs >= 264 or cfg.block_n == (16 if cfg.use_dot else 8), (m, k, n, cfg)


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
