"""Block pool invariants: no block owned twice, free + used == total, deallocate returns all."""

from __future__ import annotations

import random

import pytest

from jacana_engine.core.sequence import Sequence
from jacana_engine.kv_cache.block_manager import BlockManager, OutOfBlocksError
from jacana_engine.sample.params import SamplingParams


def make_seq(rid: str, n_prompt: int) -> Sequence:
    return Sequence(rid, list(range(n_prompt)), SamplingParams(), max_tokens=16)


def check_invariants(bm: BlockManager, seqs: list[Sequence]) -> None:
    owned = [b for s in seqs for b in s.block_table]
    assert len(owned) == len(set(owned)), "a block is owned twice"
    assert not set(owned) & set(bm.free_block_ids), "a free block is also owned"
    assert len(set(bm.free_block_ids)) == bm.num_free_blocks
    assert bm.num_free_blocks + len(owned) == bm.num_total_blocks
    assert bm.num_used_blocks == len(owned)
    for s in seqs:
        assert len(s.block_table) * bm.block_size >= s.num_computed_tokens
    for b in bm.blocks:
        assert b.ref_count == (b.block_id in set(owned))


def test_allocate_covers_the_chunk_and_only_that():
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = make_seq("a", 9)
    assert bm.num_new_blocks(seq, 9) == 3
    bm.allocate(seq, 9)
    assert len(seq.block_table) == 3
    seq.num_computed_tokens = 9
    # Slots 9..11 are already in the third block: a decode needs nothing new.
    assert bm.num_new_blocks(seq, 3) == 0
    bm.append_slot(seq)
    assert len(seq.block_table) == 3
    seq.num_computed_tokens = 12
    bm.append_slot(seq)
    assert len(seq.block_table) == 4
    check_invariants(bm, [seq])


def test_chunked_growth_matches_one_shot_allocation():
    bm = BlockManager(num_blocks=16, block_size=4)
    seq = make_seq("a", 23)
    for chunk in (5, 7, 11):
        bm.allocate(seq, chunk)
        seq.num_computed_tokens += chunk
    assert len(seq.block_table) == bm.blocks_for_tokens(23) == 6
    check_invariants(bm, [seq])


def test_can_allocate_refuses_and_allocate_raises_when_short():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq("a", 9)
    assert not bm.can_allocate(seq, 9)
    with pytest.raises(OutOfBlocksError):
        bm.allocate(seq, 9)
    assert seq.block_table == [] and bm.num_free_blocks == 2
    assert bm.can_allocate(seq, 8)


def test_deallocate_returns_every_block():
    bm = BlockManager(num_blocks=8, block_size=2)
    a, b = make_seq("a", 5), make_seq("b", 7)
    bm.allocate(a, 5)
    bm.allocate(b, 7)
    assert bm.num_free_blocks == 1
    bm.deallocate(a)
    assert a.block_table == [] and bm.num_free_blocks == 4
    bm.deallocate(b)
    assert bm.num_free_blocks == bm.num_total_blocks == 8
    assert sorted(bm.free_block_ids) == list(range(8))
    check_invariants(bm, [a, b])


def test_random_workload_keeps_invariants():
    rng = random.Random(0)
    bm = BlockManager(num_blocks=40, block_size=4)
    live: list[Sequence] = []
    for step in range(2000):
        op = rng.random()
        if op < 0.3:
            seq = make_seq(f"s{step}", rng.randint(1, 30))
            n = rng.randint(1, seq.num_tokens)
            if bm.can_allocate(seq, n):
                bm.allocate(seq, n)
                seq.num_computed_tokens = n
                live.append(seq)
        elif op < 0.8 and live:
            seq = rng.choice(live)
            if bm.can_append(seq):
                bm.append_slot(seq)
                seq.num_computed_tokens += 1
        elif live:
            seq = live.pop(rng.randrange(len(live)))
            bm.deallocate(seq)
        check_invariants(bm, live)
    for seq in live:
        bm.deallocate(seq)
    assert bm.num_free_blocks == bm.num_total_blocks


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (4, 0)])
def test_rejects_empty_pool_or_blocks(num_blocks, block_size):
    with pytest.raises(ValueError):
        BlockManager(num_blocks, block_size)


def test_trim_frees_whole_blocks_past_the_kept_tokens():
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = make_seq("a", 5)
    bm.allocate(seq, 5 + 7)  # the last token and drafts reserved: 12 slots, 3 blocks
    seq.num_computed_tokens = 6
    assert bm.trim(seq, 6) == 1
    assert len(seq.block_table) == 2 == bm.blocks_for_tokens(seq.num_computed_tokens)
    assert bm.trim(seq, 8) == 0  # nothing past a partially used block goes
    check_invariants(bm, [seq])
    with pytest.raises(ValueError):
        bm.trim(seq, 5)  # below the computed length
    bm.deallocate(seq)
    assert bm.num_free_blocks == bm.num_total_blocks


def test_trim_keeps_shared_cached_blocks_and_their_hashes():
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    first = make_seq("a", 9)
    bm.allocate(first, 9)
    first.num_computed_tokens = 9
    bm.commit(first)  # two full blocks registered
    second = make_seq("b", 9)
    match = bm.match_prefix(second)
    assert match.num_tokens == 8
    bm.allocate(second, 1 + 6, match)  # one prompt token and six drafts
    second.num_computed_tokens = 9
    assert bm.trim(second, 9) == 1
    assert second.block_table[:2] == first.block_table[:2]
    assert [bm.blocks[b].ref_count for b in second.block_table] == [2, 2, 1]
    assert bm.num_free_cached_blocks == 0
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_total_blocks
    bm.deallocate(first)
    bm.deallocate(second)
    assert bm.num_free_cached_blocks == 2
    assert bm.num_free_blocks == bm.num_total_blocks
