"""What streaming through the gateway costs the gateway: CPU time per SSE chunk.

A stand-in engine (a gRPC server in its own process that answers every Generate with
``--tokens`` one-token messages as fast as it can, no model) sits behind the real gateway
(``python -m jacana_gateway``, its own process); C concurrent clients stream chat
completions through it, R requests each. Reported per repetition: chunks/s through the
gateway and the gateway process's CPU time per chunk (user + system, from /proc), the
figure that says how many streamed tokens per second one gateway process can carry.

The stand-in engine and the clients share the machine with the gateway, so chunks/s is
a floor; CPU time per chunk is the gateway's own. Linux only (reads /proc).

Usage: python bench/gateway_stream.py [--concurrency 64] [--requests 4] [--tokens 128]
       [--reps 3] [--out bench/results]

Writes ``bench/results/gateway_stream/cpu-<logical CPUs>core.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS_DIR, cpu_machine, fmt_spread, hardware, spread, write_results

FAKE_ENGINE = """
import asyncio, sys
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb, engine_pb2_grpc

TOKENS = int(sys.argv[2])

class Engine(engine_pb2_grpc.EngineServicer):
    async def Generate(self, request, context):
        for i in range(TOKENS):
            yield pb.GenerateResponse(token_ids=[i], text=" tok")
            if i % 8 == 0:
                await asyncio.sleep(0)  # let other streams interleave, as steps do
        yield pb.GenerateResponse(
            finish_reason=pb.FINISH_REASON_STOP,
            usage=pb.Usage(prompt_tokens=1, completion_tokens=TOKENS),
        )

async def main():
    server = grpc.aio.server()
    engine_pb2_grpc.add_EngineServicer_to_server(Engine(), server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
    await server.start()
    await checks.set("jacana.engine.v1.Engine", health_pb2.HealthCheckResponse.SERVING)
    await server.wait_for_termination()

asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_http(url: str, timeout: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            try:
                if (await http.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit(f"the gateway at {url} did not become healthy")


async def stream_load(url: str, concurrency: int, requests: int) -> tuple[int, float]:
    """(chunks received, seconds) for ``concurrency`` clients of ``requests`` streams."""
    import httpx

    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}

    async def client(http: httpx.AsyncClient) -> int:
        chunks = 0
        for _ in range(requests):
            async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    chunks += line.startswith("data: {")
        return chunks

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        started = time.perf_counter()
        counts = await asyncio.gather(*(client(http) for _ in range(concurrency)))
        return sum(counts), time.perf_counter() - started


def measure(args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    engine_port, gateway_port = free_port(), free_port()
    engine = subprocess.Popen(
        [sys.executable, "-c", FAKE_ENGINE, str(engine_port), str(args.tokens)], env=env
    )
    gateway_env = {
        **env,
        "JACANA_GATEWAY_HOST": "127.0.0.1",
        "JACANA_GATEWAY_PORT": str(gateway_port),
        "JACANA_GATEWAY_ENGINES": json.dumps({"m": [f"127.0.0.1:{engine_port}"]}),
        "JACANA_GATEWAY_LOG_LEVEL": "warning",
    }
    gateway = subprocess.Popen([sys.executable, "-m", "jacana_gateway"], env=gateway_env)
    url = f"http://127.0.0.1:{gateway_port}"
    load_start = os.getloadavg()
    try:
        asyncio.run(wait_http(url))
        asyncio.run(stream_load(url, 4, 1))  # warm-up: connections, first requests
        rates, cpu_us = [], []
        for rep in range(args.reps):
            before = cpu_seconds(gateway.pid)
            chunks, seconds = asyncio.run(stream_load(url, args.concurrency, args.requests))
            used = cpu_seconds(gateway.pid) - before
            rates.append(chunks / seconds)
            cpu_us.append(1e6 * used / chunks)
            print(f"[gateway] rep {rep + 1}: {chunks / seconds:,.0f} chunks/s, "
                  f"{1e6 * used / chunks:.1f} us gateway CPU per chunk", flush=True)  # fmt: skip
    finally:
        for proc in (gateway, engine):
            proc.terminate()
            proc.wait(10)
    return {
        "benchmark": "gateway_stream",
        "settings": {
            "concurrency": args.concurrency,
            "requests_per_client": args.requests,
            "tokens_per_request": args.tokens,
            "reps": args.reps,
        },
        "machine": cpu_machine(load_start),
        "chunks_per_s": spread(rates),
        "gateway_cpu_us_per_chunk": spread(cpu_us),
    }


def render(doc: dict) -> str:
    s, m = doc["settings"], doc["machine"]
    per_chunk = doc["gateway_cpu_us_per_chunk"]["median"]
    return "\n".join(
        [
            "# Streaming through the gateway: its CPU time per SSE chunk",
            "",
            f"{s['concurrency']} concurrent clients x {s['requests_per_client']} streamed chat "
            f"completions of {s['tokens_per_request']} one-token messages from a stand-in "
            f"engine (no model); median (min–max) of {s['reps']} reps. Machine: "
            f"{json.dumps(m)}.",
            "",
            "| chunks/s through the gateway | gateway CPU per chunk (us) |",
            "|---:|---:|",
            f"| {fmt_spread(doc['chunks_per_s'], 0)} | "
            f"{fmt_spread(doc['gateway_cpu_us_per_chunk'], 1)} |",
            "",
            f"One gateway process (one core) carries about {1e6 / per_chunk:,.0f} streamed "
            "tokens per second at this cost; the clients and the stand-in engine share the "
            "machine, so the chunks/s column is a floor.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=4, help="streams per client")
    parser.add_argument("--tokens", type=int, default=128, help="messages per stream")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root")
    args = parser.parse_args()
    doc = measure(args)
    table = render(doc)
    write_results(args.out, "gateway_stream", doc, table, hardware("cpu"))
    print(table)


if __name__ == "__main__":
    main()
