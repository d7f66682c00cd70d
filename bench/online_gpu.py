"""Online GPU benchmark: OpenAI-style streaming load through the gateway and gRPC.

Starts the real engine (``python -m jacana_engine``, random bf16 weights of the real
shapes) and the gateway as processes on loopback ports, then keeps ``--concurrency``
streaming ``/v1/completions`` requests in flight (closed loop: each client sends its
next request when the previous one ends) until ``--requests`` have run. Prompts are
random token ids (1024 by default), 128 new tokens, greedy, EOS ignored.

Dummy checkpoints ship no tokenizer, and the gateway streams text, so the model
directory gets a synthetic word-level ``tokenizer.json`` ("w0", "w1", ...) covering the
whole vocabulary: every token is one word of text, one SSE chunk.

Per rep: output tok/s (usage.completion_tokens over wall time), median TTFT (request
sent -> first text chunk) and median TPOT ((last chunk - first chunk) / (tokens - 1)).
The result is the share of the offline figure: where ``<out>/offline_gpu/<hardware>.json``
holds this model's ``c64`` (same shapes, engine in-process; run it first, in the same
session on the same card), the online tok/s are set against it. ``--tuning-cache`` (the
same file as the offline run's) spares the engine's start-up its decode-GEMM timing.

Writes ``<out>/online_gpu/<hardware>.json`` and ``.md`` (``--out``, default bench/results).

Usage: python bench/online_gpu.py --model qwen3-8b [--reps 3] [--out DIR] [--tuning-cache F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    RESULTS_DIR,
    config_dir,
    environment,
    fmt_spread,
    hardware,
    random_prompts,
    results_paths,
    spread,
    triton_cache_kernels,
    write_results,
)

MODEL_ID = "bench"


def synthetic_model_dir(model: str) -> Path:
    """A temp dir with the model's config.json and a word-level tokenizer over its vocab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    src = config_dir(model) / "config.json"
    vocab = json.loads(src.read_text())["vocab_size"]
    out = Path(tempfile.mkdtemp(prefix=f"{model}-"))
    shutil.copy(src, out / "config.json")
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 40960}))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(module: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", module],
        env={**os.environ, **env},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


async def _wait_healthy(
    client, url: str, procs: dict[str, tuple[subprocess.Popen, Path]], timeout: float
) -> None:
    """Poll ``url`` until it answers 200; fail early (with the log) if a process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, (proc, log) in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if (await client.get(url, timeout=2.0)).status_code == 200:
                return
        except Exception:  # not up yet
            pass
        await asyncio.sleep(0.5)
    tails = "\n".join(f"--- {n}:\n{log.read_text()[-2000:]}" for n, (_, log) in procs.items())
    raise RuntimeError(f"{url} not healthy after {timeout}s\n{tails}")


async def one_request(client, url: str, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    body = {
        "model": MODEL_ID,
        "prompt": prompt,
        "max_tokens": new_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    first = last = None
    tokens = 0
    async with client.stream("POST", url, json=body, timeout=600.0) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {await resp.aread()!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            choices = chunk.get("choices") or []
            if choices and choices[0].get("text"):
                now = time.perf_counter()
                first = first or now
                last = now
    return {"sent": sent, "first": first, "last": last, "tokens": tokens}


async def closed_loop(client, url, prompts, concurrency, new_tokens) -> dict[str, Any]:
    queue = list(prompts)
    results: list[dict[str, Any]] = []

    async def worker() -> None:
        while queue:
            results.append(await one_request(client, url, queue.pop(), new_tokens))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    total = sum(r["tokens"] for r in results)
    ttft = [r["first"] - r["sent"] for r in results if r["first"]]
    tpot = [(r["last"] - r["first"]) / (r["tokens"] - 1) for r in results
            if r["first"] and r["tokens"] > 1]  # fmt: skip
    return {
        "output_tok_s": total / wall,
        "ttft_ms": 1e3 * statistics.median(ttft),
        "tpot_ms": 1e3 * statistics.median(tpot),
        "output_tokens": total,
        "wall_s": wall,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    model_dir = synthetic_model_dir(args.model)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    engine_port, gateway_port = _free_port(), _free_port()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="online-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    tuning = {"JACANA_ENGINE_TUNING_CACHE": str(args.tuning_cache)} if args.tuning_cache else {}
    engine = _start(
        "jacana_engine",
        {
            "JACANA_ENGINE_HOST": "127.0.0.1",
            "JACANA_ENGINE_PORT": str(engine_port),
            "JACANA_ENGINE_MODEL": str(model_dir),
            "JACANA_ENGINE_MODEL_ID": MODEL_ID,
            "JACANA_ENGINE_LOAD_FORMAT": "dummy",
            "JACANA_ENGINE_DTYPE": "bfloat16",
            "JACANA_ENGINE_DEVICE": args.device,
            "JACANA_ENGINE_KV_CACHE_MEMORY": str(int(args.kv_gib * 2**30)),
            "JACANA_ENGINE_MAX_MODEL_LEN": "2048",
            "JACANA_ENGINE_MAX_NUM_SEQS": str(args.concurrency),
            "JACANA_ENGINE_MAX_NUM_BATCHED_TOKENS": str(args.max_batched_tokens),
            **tuning,
        },
        logs / "online_engine.log",
    )
    gateway = _start(
        "jacana_gateway",
        {
            "JACANA_GATEWAY_HOST": "127.0.0.1",
            "JACANA_GATEWAY_PORT": str(gateway_port),
            "JACANA_GATEWAY_ENGINES": json.dumps({MODEL_ID: [f"127.0.0.1:{engine_port}"]}),
            "JACANA_GATEWAY_MAX_IN_FLIGHT": str(4 * args.concurrency),
            "JACANA_GATEWAY_MAX_PROMPT_CHARS": str(1 << 20),
        },
        logs / "online_gateway.log",
    )
    base = f"http://127.0.0.1:{gateway_port}"
    t_start = time.monotonic()
    limits = httpx.Limits(max_connections=2 * args.concurrency)
    try:
        async with httpx.AsyncClient(limits=limits) as client:
            procs = {
                "engine": (engine, logs / "online_engine.log"),
                "gateway": (gateway, logs / "online_gateway.log"),
            }
            await _wait_healthy(client, f"{base}/health", procs, args.start_timeout)
            print(f"healthy after {time.monotonic() - t_start:.1f}s", flush=True)
            url = f"{base}/v1/completions"
            warm = random_prompts(args.concurrency, args.prompt, vocab, seed=3)
            r = await asyncio.wait_for(closed_loop(client, url, warm, args.concurrency, 8), 120)
            print(f"warm-up: {json.dumps(r)}", flush=True)
            reps = []
            for rep in range(args.reps):
                prompts = random_prompts(args.requests, args.prompt, vocab, seed=2000 + rep)
                # the engine compiles into the cache this process sees (same user, same env)
                before = triton_cache_kernels().keys()
                r = await closed_loop(client, url, prompts, args.concurrency, args.new_tokens)
                r["triton_kernels_compiled"] = len(triton_cache_kernels().keys() - before)
                print(f"rep {rep}: {json.dumps(r)}", flush=True)
                reps.append(r)
    finally:
        for proc in (gateway, engine):
            proc.terminate()
        for proc in (gateway, engine):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    summary = {k: spread([r[k] for r in reps]) for k in ("output_tok_s", "ttft_ms", "tpot_ms")}
    return {**summary, "reps": reps}


def offline_share(root: Path, machine: str, model: str, online_tok_s: float) -> dict[str, Any]:
    """The online tok/s against ``offline_gpu``'s c64 of ``model`` on ``machine`` under
    ``root`` (its median), or {} where that result is missing."""
    path = results_paths(root, "offline_gpu", machine)[0]
    try:
        c64 = json.loads(path.read_text())["models"][model]["results"]["c64"]
        offline = c64["jacana"]["output_tok_s"]["median"]
    except (OSError, KeyError, ValueError):
        return {}
    return {"offline_result": str(path), "offline_c64_tok_s": offline,
            "online_share": online_tok_s / offline}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--kv-gib", type=float, default=24.0)
    parser.add_argument("--max-batched-tokens", type=int, default=8192)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root")
    parser.add_argument("--logs", type=Path, help="engine and gateway logs (default: a temp dir)")
    parser.add_argument("--tuning-cache", type=Path, help="JACANA_ENGINE_TUNING_CACHE")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--start-timeout", type=float, default=150.0)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    machine = hardware(args.device)
    share = offline_share(args.out, machine, args.model, result["output_tok_s"]["median"])
    doc = {
        "environment": environment(),
        "model": args.model,
        "shape": {k: getattr(args, k) for k in ("concurrency", "requests", "prompt", "new_tokens")},
        "gateway_streaming": result,
        "engine_stream_interval": int(os.environ.get("JACANA_ENGINE_STREAM_INTERVAL", "1")),
        **share,
    }
    against = (
        f"**{share['online_share']:.0%}** of the offline c64's {share['offline_c64_tok_s']:,.0f} "
        f"tok/s (`{share['offline_result']}`)."
        if share
        else "No offline c64 result of this model on this hardware to set it against."
    )
    table = "\n".join(
        [
            "# Online GPU benchmark: streaming /v1/completions through gateway + gRPC",
            "",
            f"{args.model}, random bf16 weights; {args.concurrency} concurrent streams, "
            f"{args.requests} requests of {args.prompt} prompt / {args.new_tokens} new tokens "
            f"per rep; median (min–max) of {args.reps} reps; engine stream interval "
            f"{doc['engine_stream_interval']}.",
            "",
            "| output tok/s | TTFT ms | TPOT ms |",
            "|---|---|---|",
            f"| {fmt_spread(result['output_tok_s'], 0)} | {fmt_spread(result['ttft_ms'], 1)} | "
            f"{fmt_spread(result['tpot_ms'], 2)} |",
            "",
            f"Online output tok/s (median): {against}",
            "",
            "Each rep in the order run (kernels compiled: new entries in the Triton cache "
            "while it ran):",
            "",
            "| rep | output tok/s | TTFT ms | TPOT ms | kernels compiled |",
            "|---|---|---|---|---|",
            *(
                f"| {i} | {r['output_tok_s']:.0f} | {r['ttft_ms']:.1f} | {r['tpot_ms']:.2f} "
                f"| {r['triton_kernels_compiled']} |"
                for i, r in enumerate(result["reps"])
            ),
        ]
    )
    write_results(args.out, "online_gpu", doc, table, machine)
    print(table)


if __name__ == "__main__":
    main()
