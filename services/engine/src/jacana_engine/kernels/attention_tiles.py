"""The prefill attention kernel's tile table, built on the host (no Triton here: the
engine's CPU path imports this through ``prefill_graphs``).

A launch of ``kernels/prefill_attention.py`` runs one program per (KV head, table row);
row j names the sequence and the query tile (``block_q`` queries) program j attends. Only
tiles that hold queries are listed, so a mixed step (one long prompt beside many decode
rows) launches as many programs as it has tiles, not sequences x the longest's tiles.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def prefill_tiles(
    query_lens: Sequence[int], block_q: int, capacity: int | None = None
) -> np.ndarray:  # [capacity or tiles, 2] int32
    """(sequence, query tile) of every tile holding queries, the last tiles first (tile
    index descending, then sequence ascending: the GPU starts the programs with the most
    keys first), then padding rows (-1, 0), which exit at once, up to ``capacity``."""
    lens = np.asarray(query_lens, dtype=np.int64)
    counts = (lens + block_q - 1) // block_q  # [B] tiles of each sequence
    total = int(counts.sum())
    if capacity is not None and total > capacity:
        raise ValueError(f"{total} query tiles exceed the table's {capacity} rows")
    seqs = np.repeat(np.arange(len(lens)), counts)
    firsts = np.repeat(np.cumsum(counts) - counts, counts)
    tiles = np.arange(total) - firsts
    order = np.lexsort((seqs, -tiles))
    table = np.full((total if capacity is None else capacity, 2), (-1, 0), dtype=np.int32)
    table[:total, 0] = seqs[order]
    table[:total, 1] = tiles[order]
    return table


def tile_capacity(max_tokens: int, max_seqs: int, block_q: int) -> int:
    """Table rows that hold any step of at most ``max_tokens`` queries over at most
    ``max_seqs`` sequences: a sequence's tiles round its queries up by less than one tile
    (sum of ceilings <= ceiling of the sum + sequences - 1), and a tile holds a query."""
    return min(-(-max_tokens // block_q) + max_seqs - 1, max_tokens)
