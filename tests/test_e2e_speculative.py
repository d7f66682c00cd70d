"""Speculative decoding end to end over gRPC: an engine process with the n-gram proposer
reports its per-proposer counters in ``GetStats``, its greedy output equals the default
engine's (speculation off), and a request that opts out never drafts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jacana_common.grpc_client import make_channel
from jacana_common.pb.jacana.engine.v1 import engine_pb2, engine_pb2_grpc
from stack import Service, start_engine

# Repetitive text: greedy decoding continues the cycle, so prompt lookup keeps hitting.
PROMPT = "red green blue yellow, " * 12 + "red"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def spec_engine() -> Iterator[Service]:
    service = start_engine(
        JACANA_ENGINE_SPECULATIVE_PROPOSER="ngram",
        # Draft at every step (no timing-driven pause), so the counters are deterministic.
        JACANA_ENGINE_SPECULATIVE_DYNAMIC_K="false",
        JACANA_ENGINE_NUM_THREADS="1",
    )
    yield service
    service.stop()


def request(request_id: str, n: int = 1, **kw) -> engine_pb2.GenerateRequest:
    sampling = engine_pb2.SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, n=n
    )
    return engine_pb2.GenerateRequest(request_id=request_id, prompt=PROMPT, sampling=sampling, **kw)


async def generate(address: str, req: engine_pb2.GenerateRequest) -> dict[int, list[int]]:
    """Token ids per choice index."""
    out: dict[int, list[int]] = {}
    async with make_channel(address) as ch:
        async for msg in engine_pb2_grpc.EngineStub(ch).Generate(req, timeout=120):
            out.setdefault(msg.index, []).extend(msg.token_ids)
    return out


async def stats(address: str) -> engine_pb2.EngineStats:
    async with make_channel(address) as ch:
        return await engine_pb2_grpc.EngineStub(ch).GetStats(
            engine_pb2.GetStatsRequest(), timeout=5
        )


def ngram(s: engine_pb2.EngineStats) -> engine_pb2.SpeculativeStats:
    [entry] = s.speculative
    assert entry.proposer == "ngram"
    return entry


async def test_greedy_output_equals_the_default_engine_and_drafts_are_accepted(engine, spec_engine):
    before = ngram(await stats(spec_engine.address))
    plain = await generate(engine.address, request("plain"))
    spec = await generate(spec_engine.address, request("spec"))
    assert spec == plain and len(plain[0]) == MAX_TOKENS
    assert list((await stats(engine.address)).speculative) == []  # speculation off there

    after = await stats(spec_engine.address)
    got = ngram(after)
    assert got.proposals > before.proposals
    assert got.accepted_tokens > before.accepted_tokens
    assert got.draft_tokens >= got.accepted_tokens
    assert 0.0 < got.acceptance_rate <= 1.0
    assert got.acceptance_rate == pytest.approx(got.accepted_tokens / got.draft_tokens)
    assert got.mean_accepted_length == pytest.approx(1 + got.accepted_tokens / got.proposals)
    # every block is back once the request is done, rejected drafts' included
    assert after.kv_blocks_free == after.kv_blocks_total and after.kv_blocks_used == 0


async def test_an_opted_out_request_never_drafts(spec_engine):
    addr = spec_engine.address
    reference = await generate(addr, request("ref"))  # the same prompt does draft...
    before = ngram(await stats(addr))
    assert before.proposals > 0

    single = await generate(addr, request("off", disable_speculation=True))
    choices = await generate(addr, request("off-n", n=2, disable_speculation=True))
    after = ngram(await stats(addr))
    assert (after.proposals, after.draft_tokens, after.accepted_tokens) == (
        before.proposals,
        before.draft_tokens,
        before.accepted_tokens,
    )
    assert single == reference
    assert choices == {0: reference[0], 1: reference[0]}  # greedy: every choice alike

    await generate(addr, request("on-again"))  # ...and opting out was per request
    assert ngram(await stats(addr)).proposals > after.proposals
