"""Engine depth end to end: prefix-cache hits in OpenAI usage, cache salts, priorities,
context and pool limits, and the engine's stats over gRPC, on the real processes."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import openai
import pytest

from jacana_common.errors import parse_grpc_details
from jacana_common.grpc_client import make_channel
from jacana_common.pb.jacana.engine.v1 import engine_pb2, engine_pb2_grpc
from stack import MODEL_ID, start_engine

LONG_CONTEXT = (
    "Background for the questions that follow. The grey heron is a long-legged wading bird "
    "of the family Ardeidae, native throughout temperate Europe and Asia and parts of "
    "Africa. It is resident in much of its range, but some populations from the more "
    "northern parts migrate southwards in autumn. A bird of wetland areas, it can be seen "
    "around lakes, rivers, ponds, marshes and on the sea coast. It feeds mostly on aquatic "
    "creatures which it catches after standing stationary beside or in the water, or "
    "stalking its prey through the shallows. "
) * 2


def ask(client, question: str, *, salt: str | None = None, **kw):
    extra = {"cache_salt": salt} if salt else None
    return client.chat.completions.create(
        model=MODEL_ID,
        messages=[
            {"role": "system", "content": LONG_CONTEXT},
            {"role": "user", "content": question},
        ],
        temperature=0,
        max_tokens=12,
        extra_body=extra,
        **kw,
    )


def cached(resp) -> int:
    return resp.usage.prompt_tokens_details.cached_tokens


# ---- prefix caching through the gateway ---------------------------------------------------


def test_repeated_prefix_is_served_from_the_cache_with_the_same_answer(client):
    question = f"Where does the grey heron live? ({uuid.uuid4().hex[:6]})"
    first = ask(client, question)
    second = ask(client, question)
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.usage.prompt_tokens == first.usage.prompt_tokens > 200
    # All full 16-token blocks but the one holding the last prompt token are reused.
    assert cached(second) >= second.usage.prompt_tokens - 32
    assert cached(second) > cached(first) and cached(second) % 16 == 0
    # Another question after the same system prompt reuses the shared blocks too.
    other = ask(client, "What does it eat?")
    assert cached(other) >= 200


def test_completions_stream_reports_cached_tokens_in_usage(client):
    prompt = f"{uuid.uuid4().hex} {LONG_CONTEXT} Question: what family is the heron in?"
    usages = []
    for _ in range(2):
        stream = client.completions.create(
            model=MODEL_ID,
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages.append([c.usage for c in stream if c.usage is not None][-1])
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    assert usages[1].prompt_tokens_details.cached_tokens >= usages[1].prompt_tokens - 32


def test_cache_salt_separates_tenants(client):
    question = "Is the heron a migratory bird?"
    ask(client, question)  # unsalted: fills the shared namespace
    salt = f"tenant-{uuid.uuid4().hex}"
    first = ask(client, question, salt=salt)
    assert cached(first) == 0
    again = ask(client, question, salt=salt)
    assert cached(again) > 200
    assert again.choices[0].message.content == first.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"cache_salt": ""}, "cache_salt"),
        ({"cache_salt": 5}, "cache_salt"),
        ({"priority": "high"}, "priority"),
        ({"priority": 2**31}, "priority"),
    ],
)
def test_bad_scheduling_extensions_are_400(client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=1,
            extra_body=extra,
        )
    assert info.value.body["param"] == param


def test_priority_is_accepted_on_both_endpoints(client):
    chat = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        max_tokens=4,
        temperature=0,
        extra_body={"priority": -10},
    )
    assert chat.choices[0].finish_reason in ("stop", "length")
    done = client.completions.create(
        model=MODEL_ID, prompt="2+2=", max_tokens=2, temperature=0, extra_body={"priority": 3}
    )
    assert done.usage.completion_tokens <= 2


# ---- limits ---------------------------------------------------------------------------------


def test_prompt_plus_max_tokens_over_the_context_is_400_naming_it(client):
    # About 8000 prompt tokens: fits the 8192-token context alone, not with 500 more.
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_ID, prompt=" hello" * 8000, max_tokens=500)
    assert info.value.body["param"] == "max_tokens"
    assert "8192" in info.value.body["message"]


# ---- gRPC stats ------------------------------------------------------------------------------


async def test_stats_report_pool_prefix_cache_and_throughput(engine, client):
    await asyncio.to_thread(ask, client, "How tall is a grey heron?")
    await asyncio.to_thread(ask, client, "How tall is a grey heron?")
    async with make_channel(engine.address) as ch:
        stats = await engine_pb2_grpc.EngineStub(ch).GetStats(
            engine_pb2.GetStatsRequest(), timeout=5
        )
    assert stats.kv_blocks_used + stats.kv_blocks_free == stats.kv_blocks_total > 0
    assert stats.kv_blocks_cached > 0  # freed blocks that still hold prefixes
    assert 0 < stats.prefix_cache_hits_total <= stats.prefix_cache_queries_total
    rate = stats.prefix_cache_hits_total / stats.prefix_cache_queries_total
    assert stats.prefix_cache_hit_rate == pytest.approx(rate, rel=1e-5)
    assert stats.generation_tokens_per_s > 0 and stats.prompt_tokens_per_s > 0
    assert stats.steps_total > 0 and stats.preemptions_total >= 0
    # the answers' decode steps overlapped (JACANA_ENGINE_OVERLAP_DECODE is on by default)
    assert 0 < stats.overlapped_steps_total < stats.steps_total


# ---- a small engine: pool limits and priorities over gRPC -----------------------------------


@pytest.fixture(scope="module")
def small_engine():
    # 8 blocks x 16 tokens: a 128-token pool; one sequence at a time.
    service = start_engine(
        JACANA_ENGINE_NUM_KV_BLOCKS="8",
        JACANA_ENGINE_BLOCK_SIZE="16",
        JACANA_ENGINE_MAX_NUM_SEQS="1",
        JACANA_ENGINE_NUM_THREADS="1",
    )
    yield service
    service.stop()


async def generate(stub, **kw) -> tuple[list[int], engine_pb2.GenerateResponse]:
    ids, last = [], None
    async for msg in stub.Generate(engine_pb2.GenerateRequest(**kw), timeout=120):
        ids.extend(msg.token_ids)
        last = msg
    return ids, last


def greedy(max_tokens: int = 0, **kw) -> engine_pb2.SamplingParams:
    return engine_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


async def test_a_request_that_can_never_fit_the_pool_is_rejected(small_engine):
    prompt = engine_pb2.TokenIds(ids=list(range(1000, 1100)))
    async with make_channel(small_engine.address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await generate(stub, prompt_token_ids=prompt, sampling=greedy(50))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        message, param, _ = parse_grpc_details(info.value.details())
        assert param == "max_tokens" and "128" in message
        # Without a client max_tokens the request is clamped to what the pool leaves.
        ids, last = await generate(
            stub, prompt_token_ids=prompt, sampling=greedy(4096, clamp_max_tokens=True)
        )
        assert len(ids) == last.usage.completion_tokens == 28
        assert last.finish_reason == engine_pb2.FINISH_REASON_LENGTH
        stats = await stub.GetStats(engine_pb2.GetStatsRequest(), timeout=5)
        assert stats.num_waiting == stats.num_running == 0


async def test_an_urgent_request_preempts_and_the_victim_output_is_unchanged(small_engine):
    async with make_channel(small_engine.address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        before = await stub.GetStats(engine_pb2.GetStatsRequest(), timeout=5)
        low_prompt = engine_pb2.TokenIds(ids=list(range(2000, 2030)))
        low = stub.Generate(
            engine_pb2.GenerateRequest(
                request_id="low", prompt_token_ids=low_prompt, sampling=greedy(80), priority=5
            ),
            timeout=120,
        )
        order: list[str] = []
        low_ids: list[int] = []

        async def read_low():
            async for msg in low:
                low_ids.extend(msg.token_ids)
                if msg.finish_reason:
                    order.append("low")

        reader = asyncio.create_task(read_low())
        while not low_ids:
            await asyncio.sleep(0.01)
        urgent_ids, _ = await generate(
            stub,
            prompt_token_ids=engine_pb2.TokenIds(ids=list(range(3000, 3010))),
            sampling=greedy(6),
            priority=-5,
        )
        order.append("urgent")
        await reader
        assert order == ["urgent", "low"] and len(urgent_ids) == 6
        after = await stub.GetStats(engine_pb2.GetStatsRequest(), timeout=5)
        assert after.preemptions_total > before.preemptions_total
        alone, _ = await generate(stub, prompt_token_ids=low_prompt, sampling=greedy(80))
        assert low_ids == alone
