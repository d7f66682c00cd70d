"""The engine process over real gRPC: streaming, errors, abort, model info, shutdown."""

from __future__ import annotations

import asyncio
import signal

import grpc
import pytest

from jacana_common.errors import parse_grpc_details
from jacana_common.grpc_client import make_channel
from jacana_common.pb.jacana.engine.v1 import engine_pb2, engine_pb2_grpc
from stack import MODEL_ID, start_engine


def greedy(max_tokens: int, **kw) -> engine_pb2.SamplingParams:
    return engine_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


async def collect(stub, request) -> tuple[list[int], str, engine_pb2.GenerateResponse]:
    ids, text, last = [], [], None
    async for msg in stub.Generate(request, timeout=120):
        ids.extend(msg.token_ids)
        text.append(msg.text)
        last = msg
    return ids, "".join(text), last


async def test_model_info(engine):
    async with make_channel(engine.address) as ch:
        info = await engine_pb2_grpc.EngineStub(ch).GetModelInfo(
            engine_pb2.GetModelInfoRequest(), timeout=5
        )
    assert info.model_id == MODEL_ID
    assert info.architecture == "LlamaForCausalLM"
    assert info.vocab_size == 49152
    assert info.max_model_len == 8192
    assert info.has_chat_template


async def test_generate_streams_ids_text_and_usage(engine):
    async with make_channel(engine.address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        req = engine_pb2.GenerateRequest(
            request_id="t-stream",
            chat=engine_pb2.ChatInput(
                messages=[engine_pb2.ChatMessage(role="user", content="What is 2+2?")],
                add_generation_prompt=True,
            ),
            sampling=greedy(16),
        )
        ids, text, last = await collect(stub, req)
        assert last.finish_reason in (
            engine_pb2.FINISH_REASON_STOP,
            engine_pb2.FINISH_REASON_LENGTH,
        )
        assert last.usage.completion_tokens == len(ids) > 0
        assert text.strip()
        # The same ids fed back as a token-id prompt continue identically (greedy).
        again = engine_pb2.GenerateRequest(
            prompt_token_ids=engine_pb2.TokenIds(ids=ids[:0] or [1, 2, 3]),
            sampling=greedy(4),
        )
        ids2, _, last2 = await collect(stub, again)
        assert last2.usage.prompt_tokens == 3 and len(ids2) <= 4


@pytest.mark.parametrize(
    ("request_kwargs", "param"),
    [
        ({"prompt": "hi", "sampling": engine_pb2.SamplingParams(temperature=-1)}, "temperature"),
        ({"prompt": "hi", "sampling": engine_pb2.SamplingParams(top_p=2)}, "top_p"),
        ({"prompt": "x " * 9000, "sampling": greedy(8)}, "prompt"),
        ({"prompt_token_ids": engine_pb2.TokenIds(ids=[10**6]), "sampling": greedy(1)}, "prompt"),
        ({"sampling": greedy(1)}, "prompt"),
    ],
)
async def test_invalid_requests_are_invalid_argument(engine, request_kwargs, param):
    async with make_channel(engine.address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(stub, engine_pb2.GenerateRequest(**request_kwargs))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message, got_param, _ = parse_grpc_details(info.value.details())
    assert got_param == param, message


async def test_abort_rpc_ends_the_stream(engine):
    async with make_channel(engine.address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        req = engine_pb2.GenerateRequest(
            request_id="t-abort", prompt="Once upon a time", sampling=greedy(3000, ignore_eos=True)
        )
        call = stub.Generate(req, timeout=120)
        got, aborted = 0, False
        async for msg in call:
            got += len(msg.token_ids)
            if got >= 3 and not aborted:
                resp = await stub.Abort(engine_pb2.AbortRequest(request_id="t-abort"), timeout=5)
                assert resp.found
                aborted = True
            if msg.finish_reason:
                assert msg.finish_reason == engine_pb2.FINISH_REASON_ABORT
                break
        assert got < 3000
        missing = await stub.Abort(engine_pb2.AbortRequest(request_id="t-abort"), timeout=5)
        assert not missing.found


async def test_cancelled_call_frees_the_engine(engine):
    async with make_channel(engine.address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        req = engine_pb2.GenerateRequest(prompt="Once", sampling=greedy(3000, ignore_eos=True))
        call = stub.Generate(req, timeout=120)
        async for msg in call:
            if msg.token_ids:
                break
        call.cancel()
        for _ in range(200):
            stats = await stub.GetStats(engine_pb2.GetStatsRequest(), timeout=5)
            if stats.num_running == 0 and stats.num_waiting == 0:
                break
            await asyncio.sleep(0.05)
        assert stats.num_running == 0
        assert stats.kv_blocks_free == stats.kv_blocks_total


async def test_sigterm_lets_in_flight_request_finish():
    service = await asyncio.to_thread(start_engine)
    try:
        async with make_channel(service.address) as ch:
            stub = engine_pb2_grpc.EngineStub(ch)
            req = engine_pb2.GenerateRequest(prompt="Hello", sampling=greedy(24, ignore_eos=True))
            call = stub.Generate(req, timeout=120)
            ids = []
            signalled = False
            async for msg in call:
                ids.extend(msg.token_ids)
                # One SIGTERM, as an orchestrator sends: a second one could land after the
                # server closed its loop and restored the default handler, killing it.
                if len(ids) >= 2 and not signalled:
                    service.process.send_signal(signal.SIGTERM)
                    signalled = True
                last = msg
            assert len(ids) == 24
            assert last.finish_reason == engine_pb2.FINISH_REASON_LENGTH
        assert await asyncio.to_thread(service.process.wait, 30) == 0
    finally:
        service.stop()
