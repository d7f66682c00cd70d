"""n choices of one request: derived seeds, merged streams, shared prompt blocks, abort."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from jacana_engine.core.async_engine import AsyncEngine
from jacana_engine.core.choices import (
    MAX_SEED,
    choice_params,
    choice_request_id,
    generate_choices,
)
from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.sample.params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SAMPLED = SamplingParams(temperature=1.0, seed=40, max_tokens=12, ignore_eos=True)


def prompt_of(length: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 96, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


async def collect(engine, request_id, prompt, params, n) -> dict[int, list]:
    outs: dict[int, list] = {}
    async for index, out in generate_choices(engine, request_id, prompt, params, n):
        outs.setdefault(index, []).append(out)
    return outs


def tokens(outs: list) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def test_choice_ids_and_params():
    assert choice_request_id("r", 0, 1) == "r"
    assert [choice_request_id("r", i, 3) for i in range(3)] == ["r#0", "r#1", "r#2"]
    sp = dataclasses.replace(SAMPLED, seed=MAX_SEED - 1, prompt_logprobs=2)
    assert choice_params(sp, 0) == sp
    assert choice_params(sp, 1).seed == 0  # wraps like the unsigned 64-bit wire value
    assert choice_params(sp, 1).prompt_logprobs is None
    assert choice_params(SamplingParams(), 3).seed is None


async def test_choice_i_samples_like_a_single_request_seeded_seed_plus_i(toy):
    prompt = prompt_of(9)
    async_engine = AsyncEngine(engine=toy.engine())
    try:
        outs = await collect(async_engine, "req", prompt, SAMPLED, 4)
    finally:
        await async_engine.shutdown()
    assert sorted(outs) == [0, 1, 2, 3]
    for i, choice in outs.items():
        assert [o.finished for o in choice].count(True) == 1 and choice[-1].finished
        assert all(o.request_id == f"req#{i}" for o in choice)
        solo = toy.engine().generate([prompt], dataclasses.replace(SAMPLED, seed=40 + i))[0]
        assert tokens(choice) == solo
    assert len({tuple(tokens(c)) for c in outs.values()}) == 4, "choices should differ"
    again = toy.engine().generate([prompt], SAMPLED)[0]
    assert tokens(outs[0]) == again  # choice 0 is the n=1 answer


async def test_choices_share_the_prompt_blocks_through_the_prefix_cache(toy):
    prompt = prompt_of(40, seed=1)  # ten full blocks of 4
    engine = toy.engine(enable_prefix_caching=True)
    async_engine = AsyncEngine(engine=engine)
    try:
        outs = await collect(async_engine, "shared", prompt, SAMPLED, 4)
    finally:
        await async_engine.shutdown()
    assert len(outs) == 4
    # choice 0 computes the prompt; the others only the last block's worth of it
    decoded = 4 * (SAMPLED.max_tokens - 1)
    assert engine.model.tokens_computed - decoded <= len(prompt) + 3 * 4


async def test_prompt_logprobs_reach_every_choice(toy):
    prompt = prompt_of(10, seed=2)
    sp = dataclasses.replace(SAMPLED, prompt_logprobs=1, logprobs=0)
    async_engine = AsyncEngine(engine=toy.engine())
    try:
        outs = await collect(async_engine, "plp", prompt, sp, 3)
    finally:
        await async_engine.shutdown()
    first = [outs[i][0].prompt_logprobs for i in range(3)]
    assert [e.token_id for e in first[0]] == prompt
    assert first[1] == first[0] and first[2] == first[0]
    for choice in outs.values():
        assert all(o.prompt_logprobs is None for o in choice[1:])
        assert [e.token_id for o in choice for e in o.logprobs] == tokens(choice)


async def test_closing_early_aborts_every_choice(toy):
    engine = toy.engine()
    async_engine = AsyncEngine(engine=engine)
    long = dataclasses.replace(SAMPLED, max_tokens=200)
    try:
        stream = generate_choices(async_engine, "early", prompt_of(5), long, 3)
        seen = set()
        async for index, _ in stream:
            seen.add(index)
            if len(seen) == 3:
                break
        await stream.aclose()
        for _ in range(200):  # the aborts are fire-and-forget: wait for the engine thread
            if async_engine.stats().num_running + async_engine.stats().num_waiting == 0:
                break
            await asyncio.sleep(0.01)
        stats = async_engine.stats()
        assert stats.num_running == stats.num_waiting == 0
        assert stats.kv_blocks_free == stats.kv_blocks_total
    finally:
        await async_engine.shutdown()


async def test_an_invalid_request_raises_and_leaves_nothing_running(toy):
    async_engine = AsyncEngine(engine=toy.engine())
    bad = dataclasses.replace(SAMPLED, logit_bias={500: 1.0})
    try:
        with pytest.raises(InvalidRequestError) as info:
            await collect(async_engine, "bad", prompt_of(5), bad, 3)
        assert info.value.param == "logit_bias"
        await asyncio.sleep(0.05)
        assert async_engine.stats().num_running == async_engine.stats().num_waiting == 0
    finally:
        await async_engine.shutdown()


async def test_servicer_streams_indexed_choices_and_aborts_them_together(toy):
    from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
    from jacana_engine.entrypoints.server import EngineServicer

    async_engine = AsyncEngine(engine=toy.engine())
    servicer = EngineServicer(async_engine)

    def request(rid: str, max_tokens: int) -> pb.GenerateRequest:
        sampling = pb.SamplingParams(
            temperature=1.0, seed=3, max_tokens=max_tokens, ignore_eos=True, n=3, logprobs=2
        )
        return pb.GenerateRequest(
            request_id=rid, prompt_token_ids=pb.TokenIds(ids=prompt_of(7)), sampling=sampling
        )

    try:
        messages = [m async for m in servicer.Generate(request("g", 6), None)]
        for i in range(3):
            mine = [m for m in messages if m.index == i]
            assert sum(len(m.token_ids) for m in mine) == 6
            assert all(len(m.logprobs) == len(m.token_ids) for m in mine)
            assert all(len(lp.top_logprobs) == 2 for m in mine for lp in m.logprobs)
            assert mine[-1].finish_reason == pb.FINISH_REASON_LENGTH
            assert mine[-1].usage.completion_tokens == 6

        stream = servicer.Generate(request("g2", 200), None)
        await anext(stream)
        assert (await servicer.Abort(pb.AbortRequest(request_id="g2"), None)).found
        rest = [m async for m in stream]
        ended = {m.index for m in rest if m.finish_reason == pb.FINISH_REASON_ABORT}
        assert ended == {0, 1, 2}
    finally:
        await async_engine.shutdown()


@pytest.mark.parametrize("n", [0, 129])
async def test_n_out_of_bounds_is_invalid(n):
    with pytest.raises(InvalidRequestError) as info:
        await collect(None, "r", [1], SAMPLED, n)
    assert info.value.param == "n"
