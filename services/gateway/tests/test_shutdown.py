"""``python -m jacana_gateway`` drains in-flight streams on SIGTERM, within a grace period."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys

import httpx

from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb

CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


async def start_gateway(
    engine_address: str, grace_s: float
) -> tuple[asyncio.subprocess.Process, str]:
    env = {
        **os.environ,
        "JACANA_GATEWAY_HOST": "127.0.0.1",
        "JACANA_GATEWAY_PORT": "0",
        "JACANA_GATEWAY_ENGINES": json.dumps({"m": [engine_address]}),
        "JACANA_GATEWAY_SHUTDOWN_GRACE_S": str(grace_s),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "jacana_gateway", env=env, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(30):
        while line := (await proc.stderr.readline()).decode():
            if match := re.search(r"running on (http://127\.0\.0\.1:\d+)", line):
                # Keep reading the log so that a full pipe never blocks the gateway.
                drain = asyncio.create_task(proc.stderr.read())
                proc.drain = drain  # type: ignore[attr-defined]  (keeps the task referenced)
                return proc, match.group(1)
    raise AssertionError(f"gateway did not start (exit {await proc.wait()})")


async def stop_gateway(proc: asyncio.subprocess.Process) -> None:
    """Kill the gateway if it still runs, and print the end of its log (pytest shows it
    when the test failed)."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()
    drain = getattr(proc, "drain", None)
    if drain is not None:
        print("gateway log (end):\n" + (await drain).decode(errors="replace")[-4000:])


async def open_stream(http: httpx.AsyncClient, url: str):
    cm = http.stream("POST", f"{url}/v1/chat/completions", json=CHAT)
    resp = await cm.__aenter__()
    assert resp.status_code == 200
    lines = resp.aiter_lines()
    while not (await anext(lines)).startswith("data: {"):
        pass
    return cm, lines


async def test_sigterm_lets_an_open_stream_finish(engine, script):
    messages = [pb.GenerateResponse(text=f"t{i} ") for i in range(8)]
    messages.append(pb.GenerateResponse(finish_reason=pb.FINISH_REASON_STOP, usage=pb.Usage()))
    engine.servicer.script = script(messages, pause_s=0.15)
    proc, url = await start_gateway(engine.address, grace_s=20)
    try:
        async with httpx.AsyncClient(timeout=20) as http:
            cm, lines = await open_stream(http, url)
            proc.send_signal(signal.SIGTERM)
            rest = [line async for line in lines if line]
            await cm.__aexit__(None, None, None)
            assert rest[-1] == "data: [DONE]"
            text = "".join(
                json.loads(x[6:])["choices"][0]["delta"].get("content", "") for x in rest[:-1]
            )
            assert text == "".join(m.text for m in messages)
            # Draining: new connections are refused meanwhile / afterwards. A client of its
            # own, so the probe opens a new connection instead of reusing the stream's
            # pooled one (which the gateway closes: a read error, not a refusal).
            async with httpx.AsyncClient(timeout=20) as probe:
                try:
                    await probe.get(f"{url}/health")
                    raise AssertionError("a draining gateway accepted a new connection")
                except httpx.ConnectError:
                    pass
        code = await asyncio.wait_for(proc.wait(), 20)
        assert code in (0, -signal.SIGTERM)
        assert engine.servicer.completed and not engine.servicer.cancelled
    finally:
        await stop_gateway(proc)


async def test_streams_still_open_after_the_grace_period_are_cancelled(engine, script):
    engine.servicer.script = script([pb.GenerateResponse(text="a")], hang=True)
    proc, url = await start_gateway(engine.address, grace_s=0.5)
    try:
        async with httpx.AsyncClient(timeout=20) as http:
            cm, lines = await open_stream(http, url)
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(engine.servicer.cancelled_event.wait(), 10)
            code = await asyncio.wait_for(proc.wait(), 10)
            assert code in (0, -signal.SIGTERM)
            try:
                async for _ in lines:
                    pass
            except httpx.HTTPError:
                pass  # the connection was cut: that is the expected end
            await cm.__aexit__(None, None, None)
    finally:
        await stop_gateway(proc)
