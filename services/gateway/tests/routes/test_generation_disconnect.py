"""A client that goes away cancels its engine call; load is spread by in-flight count.

These run the gateway under a real uvicorn on a free port (in-process transports cannot
disconnect), with RecordingEngines that keep their calls open until cancelled.
"""

from __future__ import annotations

import asyncio
import json

import httpx

from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb

CHAT = {"model": "m", "messages": [{"role": "user", "content": "tell me everything"}]}


def delta(text: str) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=text, token_ids=[1])


async def first_chunk(resp: httpx.Response) -> dict:
    """The first chunk of an SSE response, leaving the response open.

    (Breaking out of ``async for line in resp.aiter_lines()`` would not do: the abandoned
    iterator is finalized, which closes the connection — a disconnect.)
    """
    lines = resp.aiter_lines()
    resp.extensions["lines"] = lines  # keep it referenced while the response is open
    while not (line := await anext(lines)).startswith("data: {"):
        pass
    return json.loads(line.removeprefix("data: "))


async def test_disconnect_mid_stream_cancels_the_engine_call(make_settings, serve, engine, script):
    engine.servicer.script = script([delta("one"), delta("two")], hang=True)
    async with serve(make_settings({"m": [engine.address]})) as url, httpx.AsyncClient() as http:
        async with http.stream(
            "POST", f"{url}/v1/chat/completions", json={**CHAT, "stream": True}
        ) as resp:
            assert resp.status_code == 200
            assert (await first_chunk(resp))["choices"][0]["delta"] == {"role": "assistant"}
            await asyncio.sleep(0.1)
            assert not engine.servicer.cancelled  # still streaming while the client listens
        # Leaving the block closed the connection mid-stream.
        await asyncio.wait_for(engine.servicer.cancelled_event.wait(), 5)
        assert engine.servicer.cancelled == [engine.servicer.requests[0].request_id]
        assert engine.servicer.completed == []


async def test_disconnect_before_the_first_token_cancels_the_engine_call(
    make_settings, serve, engine, script
):
    engine.servicer.script = script(hang=True)  # e.g. a long prefill or a queue
    async with serve(make_settings({"m": [engine.address]})) as url, httpx.AsyncClient() as http:
        for stream in (True, False):
            engine.servicer.cancelled_event.clear()
            request = asyncio.create_task(
                http.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": stream})
            )
            engine.servicer.started.clear()
            await asyncio.wait_for(engine.servicer.started.wait(), 5)
            request.cancel()  # the client gives up: its connection closes
            await asyncio.wait_for(engine.servicer.cancelled_event.wait(), 5)
        assert len(engine.servicer.cancelled) == 2


async def test_disconnect_frees_the_admission_slot_and_the_replica(
    make_settings, serve, engine, script
):
    engine.servicer.script = script([delta("x")], hang=True)
    config = make_settings({"m": [engine.address]}, max_in_flight=1)
    async with serve(config) as url, httpx.AsyncClient() as http:
        async with http.stream(
            "POST", f"{url}/v1/chat/completions", json={**CHAT, "stream": True}
        ) as resp:
            await first_chunk(resp)
            busy = await http.post(f"{url}/v1/chat/completions", json=CHAT)
            assert busy.status_code == 429
            assert busy.json()["error"]["code"] == "too_many_requests"
        await asyncio.wait_for(engine.servicer.cancelled_event.wait(), 5)
        engine.servicer.script = script(
            [pb.GenerateResponse(text="ok", finish_reason=pb.FINISH_REASON_STOP, usage=pb.Usage())]
        )
        for _ in range(20):  # the slot is released when the response task unwinds
            again = await http.post(f"{url}/v1/chat/completions", json=CHAT)
            if again.status_code != 429:
                break
            await asyncio.sleep(0.05)
        assert again.status_code == 200, again.text


async def test_requests_go_to_the_replica_with_fewest_in_flight(
    make_settings, serve, make_engine, script
):
    a, b = await make_engine(), await make_engine()
    for e in (a, b):
        e.servicer.script = script([delta("x")], hang=True)
    async with (
        serve(make_settings({"m": [a.address, b.address]})) as url,
        httpx.AsyncClient() as http,
    ):
        open_streams: dict[str, object] = {}  # request id -> its open stream context

        async def open_stream():
            cm = http.stream("POST", f"{url}/v1/chat/completions", json={**CHAT, "stream": True})
            resp = await cm.__aenter__()
            await first_chunk(resp)
            open_streams[resp.headers["x-request-id"]] = cm

        def load() -> dict:
            return {
                e.address: len(
                    {r.request_id for r in e.servicer.requests} - set(e.servicer.cancelled)
                )
                for e in (a, b)
            }

        await open_stream()
        await open_stream()
        assert sorted(load().values()) == [1, 1]  # the second went to the idle replica
        await open_stream()
        assert sorted(load().values()) == [1, 2]
        await open_stream()
        assert sorted(load().values()) == [2, 2]  # the fourth went to the less loaded one
        # Both streams of ``a`` end: the next two requests must both go to ``a``.
        for request in a.servicer.requests:
            await open_streams.pop(request.request_id).__aexit__(None, None, None)
        while len(a.servicer.cancelled) < 2:
            await asyncio.sleep(0.01)
        assert load() == {a.address: 0, b.address: 2}
        await open_stream()
        await open_stream()
        assert load() == {a.address: 2, b.address: 2}
        assert len(a.servicer.requests) == 4 and len(b.servicer.requests) == 2
        for cm in open_streams.values():
            await cm.__aexit__(None, None, None)
