"""The prefill kernel's tile table (``attention_tiles.py``): which programs a launch runs,
in which order, and how many rows a captured graph's table needs."""

from __future__ import annotations

import itertools

import pytest

from jacana_engine.kernels.attention_tiles import prefill_tiles, tile_capacity


def test_every_tile_with_queries_once_the_last_tiles_first():
    table = prefill_tiles([5, 1, 0, 3], block_q=2)
    # tiles a sequence: 3, 1, 0, 2; tile index descending, then sequence ascending
    assert table.tolist() == [[0, 2], [0, 1], [3, 1], [0, 0], [1, 0], [3, 0]]
    assert table.dtype.name == "int32"


def test_padding_rows_name_no_sequence():
    table = prefill_tiles([4], block_q=4, capacity=3)
    assert table.tolist() == [[0, 0], [-1, 0], [-1, 0]]
    with pytest.raises(ValueError, match="exceed"):
        prefill_tiles([9], block_q=4, capacity=2)
    assert prefill_tiles([], block_q=4).shape == (0, 2)


@pytest.mark.parametrize("block_q", [1, 2, 3, 8])
def test_the_capacity_holds_every_step_of_its_tokens_and_sequences(block_q):
    """Every split of up to 12 tokens over up to 4 sequences (at least one query each)."""
    for seqs in range(1, 5):
        for lens in itertools.product(range(1, 13), repeat=seqs):
            if sum(lens) > 12:
                continue
            need = len(prefill_tiles(lens, block_q))
            assert need <= tile_capacity(12, 4, block_q), (lens, block_q)
    assert tile_capacity(12, 4, 8) == 5  # e.g. lengths (1, 1, 1, 9): 1 + 1 + 1 + 2
    assert tile_capacity(12, 4, 1) == 12  # a tile a query: never more than the tokens
