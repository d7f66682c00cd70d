"""A client that goes away mid-stream stops the engine's work for it."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from jacana_common.grpc_client import make_channel
from jacana_common.pb.jacana.engine.v1 import engine_pb2, engine_pb2_grpc
from stack import MODEL_ID


async def engine_stats(address: str) -> engine_pb2.EngineStats:
    async with make_channel(address) as channel:
        return await engine_pb2_grpc.EngineStub(channel).GetStats(
            engine_pb2.GetStatsRequest(), timeout=5
        )


async def wait_until_idle(address: str, timeout: float = 10.0) -> engine_pb2.EngineStats:
    deadline = time.monotonic() + timeout
    while True:
        stats = await engine_stats(address)
        if stats.num_running == 0 and stats.num_waiting == 0:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"engine still busy after disconnect: {stats}")
        await asyncio.sleep(0.05)


async def test_http_disconnect_mid_stream_aborts_engine_request(gateway, engine):
    before = await wait_until_idle(engine.address)
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 4000,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    chunks = 0
    async with httpx.AsyncClient(timeout=60) as http:  # noqa: SIM117
        async with http.stream(
            "POST", f"http://{gateway.address}/v1/chat/completions", json=body
        ) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    json.loads(line[6:])
                    chunks += 1
                if chunks >= 5:
                    break  # leaving the block closes the connection mid-stream
    during = await engine_stats(engine.address)
    assert during.generation_tokens_total > before.generation_tokens_total
    idle = await wait_until_idle(engine.address)
    generated = idle.generation_tokens_total - before.generation_tokens_total
    # Far fewer than the 4000 tokens asked for: the engine stopped when the client left.
    assert generated < 1000, generated
    await asyncio.sleep(0.5)
    later = await engine_stats(engine.address)
    assert later.generation_tokens_total == idle.generation_tokens_total
