"""Scheduler invariants, driven by a model-free simulation of the engine loop."""

from __future__ import annotations

import random

from jacana_engine.core.outputs import FinishReason
from jacana_engine.core.scheduler import Scheduler, SchedulerOutput
from jacana_engine.core.sequence import Sequence, SequenceStatus
from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.sample.params import SamplingParams

FAKE_TOKEN = 7


def make_seq(rid: str, n_prompt: int, max_tokens: int) -> Sequence:
    return Sequence(rid, [1] * n_prompt, SamplingParams(), max_tokens=max_tokens)


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_tokens=32) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, max_tokens)


def check_step(sched: Scheduler, out: SchedulerOutput) -> None:
    """What must hold right after ``schedule()``."""
    assert out.num_batched_tokens <= sched.max_num_batched_tokens
    assert len(out.scheduled) <= sched.max_num_seqs
    assert len(sched.running) <= sched.max_num_seqs
    seqs = [s.seq for s in out.scheduled]
    assert len(seqs) == len(set(seqs)), "a sequence scheduled twice in one step"
    bm = sched.block_manager
    kinds = []
    for s in out.scheduled:
        assert s.seq.status is SequenceStatus.RUNNING
        assert s.num_new_tokens >= 1
        assert s.start == s.seq.num_computed_tokens
        assert s.start + s.num_new_tokens <= s.seq.num_tokens
        assert len(s.seq.block_table) * bm.block_size >= s.start + s.num_new_tokens
        decode = s.seq.num_uncomputed_tokens == 1 and s.seq.num_output_tokens > 0
        kinds.append("decode" if decode else "prefill")
    assert kinds == sorted(kinds), "decodes must come before prefill chunks"
    for seq in out.preempted:
        assert seq.status is SequenceStatus.WAITING and seq.block_table == []
        assert seq.num_computed_tokens == 0
    owned = [b for s in sched.running for b in s.block_table]
    assert len(owned) == len(set(owned))
    assert bm.num_free_blocks + len(owned) == bm.num_total_blocks
    assert all(not s.block_table for s in sched.waiting)


def advance(sched: Scheduler, out: SchedulerOutput) -> list[Sequence]:
    """Pretend the forward pass ran: append a token to every sampling sequence and retire
    those at their limit. Returns the finished sequences."""
    sched.update(out.scheduled)
    done = []
    for s in out.scheduled:
        if s.samples:
            s.seq.output_token_ids.append(FAKE_TOKEN)
            if s.seq.num_output_tokens == s.seq.max_tokens:
                sched.finish(s.seq, FinishReason.LENGTH)
                done.append(s.seq)
    return done


def test_random_workload_respects_limits_and_everything_finishes():
    rng = random.Random(1)
    sched = make_scheduler(num_blocks=30, block_size=4, max_num_seqs=5, max_tokens=24)
    pending = []
    for i in range(40):
        n_prompt = rng.randint(1, 70)
        pending.append((rng.randint(0, 60), make_seq(f"r{i}", n_prompt, rng.randint(1, 40))))
    pending.sort(key=lambda p: p[0])
    finished: list[Sequence] = []
    preemptions = 0
    for step in range(5000):
        while pending and pending[0][0] <= step:
            sched.add(pending.pop(0)[1])
        was_running = set(sched.running)
        out = sched.schedule()
        check_step(sched, out)
        if out.preempted:  # a step that preempts admits nobody new
            assert all(s.seq in was_running for s in out.scheduled)
        preemptions += len(out.preempted)
        finished += advance(sched, out)
        if not pending and not sched.has_unfinished():
            break
    assert not sched.has_unfinished(), "requests left behind"
    assert len(finished) == 40
    assert all(s.num_output_tokens == s.max_tokens and s.block_table == [] for s in finished)
    assert sched.block_manager.num_free_blocks == 30
    assert preemptions > 0 and sched.num_preemptions_total == preemptions


def test_admission_is_first_come_first_served():
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=3, max_tokens=16)
    seqs = [make_seq(f"r{i}", n, 3) for i, n in enumerate([10, 3, 12, 2, 9, 1, 5])]
    for seq in seqs:
        sched.add(seq)
    admitted: list[str] = []
    while sched.has_unfinished():
        out = sched.schedule()
        check_step(sched, out)
        for s in out.scheduled:
            if s.seq.request_id not in admitted:
                admitted.append(s.seq.request_id)
        # Whoever waits never arrived before someone running was admitted.
        if sched.waiting and sched.running:
            first_waiting = int(sched.waiting[0].request_id[1:])
            assert all(int(s.request_id[1:]) < first_waiting for s in sched.running)
        advance(sched, out)
    assert admitted == [s.request_id for s in seqs]


def test_long_prompt_is_chunked_while_decodes_keep_streaming():
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=4, max_tokens=16)
    a, b = make_seq("a", 3, 30), make_seq("b", 4, 30)
    sched.add(a)
    sched.add(b)
    advance(sched, sched.schedule())  # both prefilled in one step (7 tokens)
    assert a.num_output_tokens == b.num_output_tokens == 1
    long = make_seq("long", 100, 2)
    sched.add(long)
    chunks = []
    while long.num_output_tokens == 0:
        out = sched.schedule()
        check_step(sched, out)
        # The two running requests decode first every step; the long prompt gets the rest.
        assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled[:2]] == [
            ("a", 1),
            ("b", 1),
        ]
        (chunk,) = out.scheduled[2:]
        assert chunk.seq is long and chunk.num_new_tokens <= 14
        assert chunk.samples == (chunk.start + chunk.num_new_tokens == 100)
        chunks.append(chunk.num_new_tokens)
        advance(sched, out)
    assert sum(chunks) == 100 and chunks[:-1] == [14] * (len(chunks) - 1)
    assert a.num_output_tokens == 1 + len(chunks)


def test_decode_preempts_the_most_recently_admitted():
    # 4 blocks of 4 slots; each request's 6-token prompt takes 2 blocks, filling the pool.
    sched = make_scheduler(num_blocks=4, block_size=4, max_num_seqs=4, max_tokens=32)
    a, b = make_seq("a", 6, 8), make_seq("b", 6, 8)
    sched.add(a)
    sched.add(b)
    for _ in range(3):  # prefill, then decodes writing slots 6 and 7
        advance(sched, sched.schedule())
    assert sched.block_manager.num_free_blocks == 0
    assert a.num_computed_tokens == 8 and a.num_uncomputed_tokens == 1
    b_blocks = list(b.block_table)
    out = sched.schedule()  # a needs a 3rd block for slot 8: b goes
    check_step(sched, out)
    assert out.preempted == [b]
    assert list(sched.waiting) == [b] and sched.running == [a]
    assert b.num_computed_tokens == 0 and b.num_output_tokens == 3 and b.num_preemptions == 1
    # b's blocks went back to the pool and one of them now holds a's next slots.
    assert a.block_table[-1] in b_blocks
    assert sched.block_manager.num_free_blocks == 1
    assert [s.seq for s in out.scheduled] == [a]
    while sched.has_unfinished():
        out = sched.schedule()
        check_step(sched, out)
        advance(sched, out)
    assert a.num_output_tokens == b.num_output_tokens == 8
    assert sched.block_manager.num_free_blocks == 4


def test_youngest_preempts_itself_and_older_keeps_its_blocks():
    sched = make_scheduler(num_blocks=3, block_size=4, max_num_seqs=4, max_tokens=32)
    a, b = make_seq("a", 3, 2), make_seq("b", 8, 3)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()  # a: 1 block, b: 2 blocks -> pool full
    advance(sched, out)
    a_table = list(a.block_table)
    out = sched.schedule()  # a decodes in place; b's slot 8 needs a 4th block
    check_step(sched, out)
    assert out.preempted == [b] and [s.seq for s in out.scheduled] == [a]
    assert a.block_table == a_table


def test_abort_frees_blocks_wherever_the_request_is():
    sched = make_scheduler(num_blocks=8, block_size=4, max_num_seqs=1, max_tokens=32)
    a, b = make_seq("a", 10, 5), make_seq("b", 5, 5)
    sched.add(a)
    sched.add(b)
    advance(sched, sched.schedule())
    assert sched.running == [a] and list(sched.waiting) == [b]
    assert sched.abort("b") is b and b.finish_reason is FinishReason.ABORT
    assert sched.abort("a") is a and a.status is SequenceStatus.FINISHED
    assert a.block_table == [] and sched.block_manager.num_free_blocks == 8
    assert sched.abort("a") is None and not sched.has_unfinished()
    assert sched.schedule().is_empty


def test_batch_size_is_capped_by_the_token_budget():
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=16, max_tokens=4)
    assert sched.max_num_seqs == 4
