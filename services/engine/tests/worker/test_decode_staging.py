"""DecodeStaging (the host side of CUDA-graph decode and verify steps) against build_batch.

The staging buffers are filled incrementally (a table row is only extended while it holds
the same sequence at the same ``block_table_epoch``), so these tests drive real block
manager histories: growth across block boundaries, a batch that shrinks and regrows,
rows changing hands, a preempted sequence re-allocated, a trimmed table. After every
step the staged rows must equal what ``build_batch`` computes from scratch.
"""

from __future__ import annotations

import random

import torch

from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.core.sequence import Sequence
from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.sample.params import SamplingParams
from jacana_engine.worker.batch import build_batch
from jacana_engine.worker.decode_graphs import DecodeStaging

BLOCK = 4
MAX_BATCH = 8
MAX_BLOCKS = 16


def _new_seq(name: str, prompt_len: int, bm: BlockManager) -> Sequence:
    seq = Sequence(name, [100 + i for i in range(prompt_len)], SamplingParams(), 64)
    bm.allocate(seq, prompt_len)
    seq.num_computed_tokens = prompt_len
    seq.output_token_ids.append(7)  # the token the prefill sampled: decoded next
    return seq


def _decode_step(seqs: list[Sequence], bm: BlockManager) -> list[ScheduledSequence]:
    """Plan one decode step: each sequence computes its last token."""
    plan = []
    for seq in seqs:
        bm.append_slot(seq)
        plan.append(ScheduledSequence(seq, seq.num_tokens - 1, 1, True))
    return plan


def _finish_step(plan: list[ScheduledSequence], rng: random.Random) -> None:
    for s in plan:
        s.seq.num_computed_tokens += 1
        s.seq.output_token_ids.append(rng.randrange(1000))


def _assert_staged(staging: DecodeStaging, plan: list[ScheduledSequence], q: int = 1) -> None:
    """The real rows equal build_batch's; every sequence's q query rows sit at the
    positions the attention kernel gives them (seq_len - q + j); padding writes no KV."""
    expected = build_batch(plan, BLOCK)
    n, b = staging.rows, len(plan)
    i64, i32 = staging.host64, staging.host32
    real = i64[3 * n : 3 * n + len(expected.input_ids)]
    assert i64[:n][real].tolist() == expected.input_ids.tolist()
    assert i64[n : 2 * n][real].tolist() == expected.positions.tolist()
    assert i64[2 * n : 3 * n][real].tolist() == expected.meta.slot_mapping.tolist()
    assert i32[:b].tolist() == expected.meta.seq_lens.tolist()
    for row, s in enumerate(plan):
        end = s.start + s.num_new_tokens
        assert i64[n + row * q : n + row * q + q].tolist() == list(range(end - q, end))
        pad = q - s.num_new_tokens
        assert i64[2 * n + row * q : 2 * n + row * q + pad].eq(-1).all()
    tables = i32[staging.max_batch :].view(staging.max_batch, MAX_BLOCKS)
    for row, s in enumerate(plan):
        width = len(s.seq.block_table)
        assert tables[row, :width].tolist() == s.seq.block_table, f"row {row}"
    # Padding sequences: token 0 at positions 0..q-1, no KV write, q tokens of KV.
    total, used = staging.max_batch * q, b * q
    assert i64[used:total].eq(0).all()
    assert i64[n + used : n + total].tolist() == list(range(q)) * (staging.max_batch - b)
    assert i64[2 * n + used : 2 * n + total].eq(-1).all()
    assert i32[b : staging.max_batch].eq(q).all()


def test_staging_matches_build_batch_through_a_changing_batch():
    rng = random.Random(0)
    bm = BlockManager(200, BLOCK)
    staging = DecodeStaging(MAX_BATCH, MAX_BLOCKS, BLOCK, pin=False)
    seqs = [_new_seq(f"s{i}", rng.randrange(1, 9), bm) for i in range(5)]
    for step in range(40):
        if step == 6:  # the batch shrinks: rows move to other sequences
            bm.deallocate(seqs.pop(1))
        if step == 12:  # and regrows past its old size
            seqs += [_new_seq(f"n{step}-{k}", rng.randrange(1, 9), bm) for k in range(4)]
        if step == 20:  # a preempted sequence comes back with other blocks, same length
            victim = seqs[2]
            bm.deallocate(victim)
            _new_seq("hog", 4 * BLOCK, bm)  # takes the blocks the victim freed
            victim.num_computed_tokens = 0
            bm.allocate(victim, victim.num_tokens - 1)  # recomputed into new blocks
            victim.num_computed_tokens = victim.num_tokens - 1
        if step == 28:  # spec-style trim: reserve ahead, then give the tail back
            seq = seqs[0]
            bm.allocate(seq, 2 * BLOCK + 1)
            bm.trim(seq, seq.num_tokens - 1)
        if step == 33:  # the same sequences in another order
            rng.shuffle(seqs)
        plan = _decode_step(seqs, bm)
        assert staging.fits(plan, 1)
        assert staging.fill(plan, 1, MAX_BATCH) == len(plan)
        _assert_staged(staging, plan)
        _finish_step(plan, rng)


def test_verify_steps_put_each_chunk_in_the_last_rows_of_its_q():
    """Chunks of one known token plus 0..3 drafts, staged at width 4, over a few steps
    (drafts of different lengths, a batch that shrinks)."""
    rng = random.Random(1)
    bm = BlockManager(200, BLOCK)
    q = 4
    staging = DecodeStaging(MAX_BATCH, MAX_BLOCKS, BLOCK, pin=False, max_query=q)
    seqs = [_new_seq(f"s{i}", rng.randrange(4, 12), bm) for i in range(6)]
    for step in range(12):
        if step == 5:
            bm.deallocate(seqs.pop(0))
        plan = []
        for seq in seqs:
            k = rng.randrange(0, q)
            drafts = [rng.randrange(1000) for _ in range(k)]
            # the draft model's plans hold tuples, the speculator's lists
            seq.spec_token_ids = tuple(drafts) if step % 2 else drafts
            bm.allocate(seq, 1 + k)
            plan.append(ScheduledSequence(seq, seq.num_tokens - 1, 1 + k, False, k))
        assert staging.fits(plan, q)
        real = staging.fill(plan, q, MAX_BATCH)
        assert real == sum(s.num_new_tokens for s in plan)
        _assert_staged(staging, plan, q)
        for s in plan:  # keep the first draft, roll the rest back
            s.seq.num_computed_tokens += 1 + min(1, s.num_draft_tokens)
            s.seq.output_token_ids += [*s.seq.spec_token_ids[:1], 7]  # accepted + bonus
            bm.trim(s.seq, s.seq.num_computed_tokens)


def test_fits_and_graph_shape_reject_what_a_graph_cannot_hold():
    bm = BlockManager(200, BLOCK)
    staging = DecodeStaging(2, 3, BLOCK, pin=False, max_query=3)
    short, long = _new_seq("a", 3, bm), _new_seq("b", 3 * BLOCK, bm)
    assert staging.fits(_decode_step([short], bm), 1)
    assert staging.fits(_decode_step([short], bm), 3)
    assert not staging.fits(_decode_step([long], bm), 1)  # table wider than the buffer
    three = [_new_seq(f"c{i}", 2, bm) for i in range(3)]
    assert not staging.fits(_decode_step(three, bm), 1)  # more rows than the largest graph
    tiny = _new_seq("d", 1, bm)  # KV length 1 < width 3: its padding would sit before 0
    assert not staging.fits(_decode_step([tiny], bm), 3)
    assert not staging.fits(_decode_step([short], bm), 4)  # wider than the buffers
    assert not staging.fits([ScheduledSequence(long, 0, 3, False)], 2)  # wider than q


def test_a_short_prompt_tail_stages_like_build_batch():
    """A chunk of several known tokens (the end of a prompt, a draft model's catch-up)
    fits a graph of its width as a verify chunk does."""
    bm = BlockManager(50, BLOCK)
    staging = DecodeStaging(MAX_BATCH, MAX_BLOCKS, BLOCK, pin=False, max_query=3)
    seq = Sequence("p", list(range(100, 109)), SamplingParams(), 8)
    bm.allocate(seq, 9)
    seq.num_computed_tokens = 6
    plan = [ScheduledSequence(seq, 6, 3, True)]
    assert staging.fits(plan, 3)
    assert staging.fill(plan, 3, MAX_BATCH) == 3
    _assert_staged(staging, plan, 3)


def test_buffers_are_views_the_device_copy_reads():
    staging = DecodeStaging(MAX_BATCH, MAX_BLOCKS, BLOCK, pin=False)
    bm = BlockManager(50, BLOCK)
    plan = _decode_step([_new_seq("a", 5, bm)], bm)
    staging.fill(plan, 1, 1)
    # The tensors the graphs copy to the device see what fill wrote through numpy.
    assert staging.host64.dtype == torch.int64 and staging.host32.dtype == torch.int32
    assert staging.host64[0].item() == 7 and staging.host32[0].item() == 6


def test_one_leading_byte_range_holds_everything_a_step_reads():
    """A step is one host-to-device copy of ``step_bytes(padded)`` leading bytes of
    ``host``: the int64 columns whole, the sequence lengths and the padded rows' tables;
    the tables of rows beyond stay out of it."""
    staging = DecodeStaging(MAX_BATCH, MAX_BLOCKS, BLOCK, pin=False)
    bm = BlockManager(50, BLOCK)
    seqs = [_new_seq(f"s{i}", 5 + 4 * i, bm) for i in range(3)]
    staging.fill(_decode_step(seqs, bm), 1, 4)
    for padded in (1, 4, MAX_BATCH):
        used = staging.host[: staging.step_bytes(padded)]
        i64 = used[: staging.host64.numel() * 8].view(torch.int64)
        i32 = used[staging.host64.numel() * 8 :].view(torch.int32)
        assert torch.equal(i64, staging.host64)
        assert i32.numel() == MAX_BATCH + padded * MAX_BLOCKS
        assert torch.equal(i32, staging.host32[: i32.numel()])
    assert staging.step_bytes(MAX_BATCH) == staging.host.numel()
    staging.stage_ring_slot(3)  # the head's ring row, the int64 part's last entry
    assert staging.host64[staging.ring_slot_at].item() == 3
    assert staging.ring_slot_at == staging.host64.numel() - 1 == 4 * staging.rows
    tables = staging.host32[MAX_BATCH:].view(MAX_BATCH, MAX_BLOCKS)
    assert tables[2, : len(seqs[2].block_table)].tolist() == seqs[2].block_table


def test_a_pending_token_stages_as_zero_at_its_own_position_and_slot():
    """Overlapped decoding: a chunk whose token is still being sampled is staged with
    token 0 (the device fills it in) at the right position, slot and KV length."""
    bm = BlockManager(200, BLOCK)
    staging = DecodeStaging(MAX_BATCH, MAX_BLOCKS, BLOCK, pin=False)
    seqs = [_new_seq(f"s{i}", n, bm) for i, n in enumerate((3, 5, 8))]
    plan = []
    for seq in seqs:
        seq.num_computed_tokens = seq.num_tokens  # the last known token is computed
        bm.allocate(seq, 1)  # a slot for the token still in flight
        plan.append(ScheduledSequence(seq, seq.num_tokens, 1, True, pending_token=True))
    staging.fill(plan, 1, MAX_BATCH)
    n, i64 = staging.rows, staging.host64
    assert i64[:3].tolist() == [0, 0, 0]
    assert i64[n : n + 3].tolist() == [s.num_tokens for s in seqs]
    bs = BLOCK
    slots = [s.block_table[s.num_tokens // bs] * bs + s.num_tokens % bs for s in seqs]
    assert i64[2 * n : 2 * n + 3].tolist() == slots
    assert staging.host32[:3].tolist() == [s.num_tokens + 1 for s in seqs]
    assert build_batch(plan, BLOCK).input_ids.tolist() == [0, 0, 0]


def test_a_stand_in_context_for_timing_is_forgotten_by_the_next_real_step():
    """``fill_context`` stages stand-in sequences over blocks 0, 1, ... that write no KV;
    a real step after it writes its sequences' tables afresh, as if the rows were new."""
    rng = random.Random(2)
    bm = BlockManager(200, BLOCK)
    staging = DecodeStaging(MAX_BATCH, MAX_BLOCKS, BLOCK, pin=False)
    seqs = [_new_seq(f"s{i}", 9, bm) for i in range(2)]
    plan = _decode_step(seqs, bm)
    staging.fill(plan, 1, MAX_BATCH)
    _finish_step(plan, rng)

    staging.fill_context(4, 2 * BLOCK + 1)  # 9 tokens: 3 blocks
    n = staging.rows
    assert staging.host32[:4].tolist() == [2 * BLOCK + 1] * 4
    tables = staging.host32[MAX_BATCH:].view(MAX_BATCH, MAX_BLOCKS)
    assert tables[:4, :3].tolist() == [[0, 1, 2]] * 4
    assert staging.host64[2 * n : 2 * n + 4].eq(-1).all()  # no KV write

    plan = _decode_step(seqs, bm)  # same sequences, same rows: tables must be rewritten
    staging.fill(plan, 1, MAX_BATCH)
    _assert_staged(staging, plan)
