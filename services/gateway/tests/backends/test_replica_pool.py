"""Replica choice, and that closing an engine stream really cancels its gRPC call."""

from __future__ import annotations

import asyncio

from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_gateway.backends.engine import engine_pool, open_stream
from jacana_gateway.routes.generation import events
from jacana_gateway.translate.generation_response import ChatFormat, Envelope


async def test_candidates_prefer_fewest_in_flight_then_rotate_and_skip_failed():
    now = [100.0]
    pool = engine_pool({"m": ["h:1", "h:2", "h:3"]}, retry_after_s=2.0, clock=lambda: now[0])
    await pool.start()
    try:
        a, b, c = pool.replicas("m")
        # All idle: the first choice rotates.
        firsts = [pool.candidates("m")[0].target for _ in range(6)]
        assert firsts == ["h:1", "h:2", "h:3", "h:1", "h:2", "h:3"]
        pool.acquire(a)
        pool.acquire(a)
        pool.acquire(b)
        assert [r.target for r in pool.candidates("m")][:2] == ["h:3", "h:2"]
        pool.mark_failed(c)
        assert [r.target for r in pool.candidates("m")] == ["h:2", "h:1", "h:3"]
        now[0] += 2.5  # the failure is forgotten after retry_after_s
        assert pool.candidates("m")[0].target == "h:3"
        pool.release(a)
        pool.release(a)
        pool.release(b)
        assert (a.in_flight, b.in_flight, c.in_flight) == (0, 0, 0)
    finally:
        await pool.close()


async def test_replicas_of_different_models_share_nothing_but_channels():
    pool = engine_pool({"x": ["h:1"], "y": ["h:1", "h:2"]})
    await pool.start()
    try:
        (x1,) = pool.replicas("x")
        y1, _ = pool.replicas("y")
        assert x1.channel is y1.channel
        pool.acquire(x1)
        assert y1.in_flight == 0
        assert "x" in pool and "z" not in pool
    finally:
        await pool.close()


async def test_closing_a_stream_cancels_the_call_and_frees_the_replica(engine, script):
    engine.servicer.script = script([pb.GenerateResponse(text="x")], hang=True)
    pool = engine_pool({"m": [engine.address]})
    await pool.start()
    try:
        stream = await open_stream(pool, "m", pb.GenerateRequest(request_id="r1"), 30)
        (replica,) = pool.replicas("m")
        assert replica.in_flight == 1
        stream.close()
        await asyncio.wait_for(engine.servicer.cancelled_event.wait(), 5)
        assert engine.servicer.cancelled == ["r1"]
        assert replica.in_flight == 0
        stream.close()  # idempotent
        assert replica.in_flight == 0
    finally:
        await pool.close()


async def test_abandoning_a_suspended_event_stream_cancels_the_call(engine, script):
    # The disconnect case where the SSE generator is parked at a ``yield`` (the server was
    # blocked sending) rather than awaiting the engine: closing it must still cancel.
    engine.servicer.script = script([pb.GenerateResponse(text="a")], hang=True)
    pool = engine_pool({"m": [engine.address]})
    await pool.start()
    try:
        stream = await open_stream(pool, "m", pb.GenerateRequest(request_id="r2"), 30)
        body = events(stream, ChatFormat(), Envelope("r2", 0, "m", "fp"), include_usage=False)
        assert b'"role":"assistant"' in await anext(body)
        assert b'"content":"a"' in await anext(body)
        await body.aclose()
        await asyncio.wait_for(engine.servicer.cancelled_event.wait(), 5)
        assert pool.replicas("m")[0].in_flight == 0
    finally:
        await pool.close()
