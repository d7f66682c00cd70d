"""What a first use costs on the host: cuBLAS GEMMs at new row counts, torch's sampling
operators at new batch sizes.

A prefill step's GEMMs run on cuBLAS with as many rows as the step has tokens, a number
that changes from step to step; the sampler's torch operators run on as many rows as the
step samples. ``compile_stability_gpu.py --replay --profile-cuda`` found a serving pass
spending ~200 ms more host time in ``aten::mm`` than the same traffic replayed, and ~50 ms
loading CUDA modules, with the GPU's own kernel times unchanged. This times, in one fresh
process, each call's host time (the call alone: its launch and whatever the library does
before it) the first time a shape is met and again right after:

- ``gemm``: Qwen3-8B's four layer GEMMs (qkv, o, gate_up, down) at random row counts
  (not multiples of 16); then after a sweep over every multiple of ``--bucket`` rows up to
  ``--max-rows`` (its wall time is reported), at new random row counts (does a sweep warm
  the neighbours?) and at new multiples of the bucket (padding a step's rows to a bucket:
  are those all warm?). With ``--blas cublas cublaslt`` each backend in turn, each on
  row counts of its own.
- ``sampling``: the sampler's operators (max, sort, topk, softmax, cumsum over a
  [N, vocab] float32 tensor) at N = 1, then at larger N in turn: which batch sizes meet
  kernels that N = 1 did not load.

Usage: python research/first_use_gpu.py [--samples 24] [--bucket 64] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from common import environment, hardware, write_results

RESULTS = Path(__file__).resolve().parent / "results"

# Qwen3-8B's layer GEMMs: (name, out features, in features)
GEMM_SHAPES = (
    ("qkv", 6144, 4096),
    ("o", 4096, 4096),
    ("gate_up", 24576, 4096),
    ("down", 4096, 12288),
)
SAMPLING_ROWS = (1, 2, 3, 4, 5, 8, 16, 17, 32, 64)


def host_us(call: Any, device: torch.device) -> float:
    """Microseconds ``call()`` holds the host, the device idle before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    call()
    return (time.perf_counter() - t0) * 1e6


def first_and_again(call: Any, device: torch.device) -> tuple[float, float]:
    return host_us(call, device), host_us(call, device)


def summary(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """Median and max host µs of the first calls and of the repeats."""
    first, again = [p[0] for p in pairs], [p[1] for p in pairs]
    return {
        "calls": len(pairs),
        "first_median_us": statistics.median(first),
        "first_max_us": max(first),
        "again_median_us": statistics.median(again),
        "extra_total_ms": (sum(first) - sum(again)) / 1e3,
    }


def gemm_rows(rng: random.Random, count: int, max_rows: int, taken: set[int]) -> list[int]:
    """``count`` row counts in [17, max_rows], none a multiple of 16, none in ``taken``."""
    rows: list[int] = []
    while len(rows) < count:
        m = rng.randint(17, max_rows)
        if m % 16 and m not in taken:
            taken.add(m)
            rows.append(m)
    return rows


def gemm_probe(args: argparse.Namespace, device: torch.device, blas: str, taken: set[int]):
    """The four GEMM phases on one BLAS backend; row counts drawn apart from ``taken``."""
    if device.type == "cuda":
        torch.backends.cuda.preferred_blas_library(blas)
    rng = random.Random(args.blas.index(blas) + 1)
    weights = {
        name: torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        for name, n, k in GEMM_SHAPES
    }
    # one input for every shape, its columns sliced: each GEMM reads it with a leading
    # dimension of 12,288 (the engine's inputs are contiguous, so their shapes differ in
    # that, and ``row_buckets.warm_row_buckets`` warms them on inputs of their own width)
    x = torch.randn(args.max_rows, 12288, device=device, dtype=torch.bfloat16)

    def calls(rows: list[int]) -> list[tuple[float, float]]:
        pairs = []
        for m in rows:
            for _, w in weights.items():
                a = x[:m, : w.shape[1]]
                pairs.append(
                    first_and_again(lambda a=a, w=w: torch.nn.functional.linear(a, w), device)
                )
        return pairs

    result: dict[str, Any] = {
        "fresh": summary(calls(gemm_rows(rng, args.samples, args.max_rows, taken)))
    }
    t0 = time.perf_counter()
    buckets = list(range(args.bucket, args.max_rows + 1, args.bucket))
    for m in buckets:
        for w in weights.values():
            torch.nn.functional.linear(x[:m, : w.shape[1]], w)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    result["sweep"] = {"buckets": len(buckets), "seconds": time.perf_counter() - t0}
    result["fresh_after_sweep"] = summary(calls(gemm_rows(rng, args.samples, args.max_rows, taken)))
    # the sweep ran each bucket once: a repeat at a bucket is what padding to it would pay
    bucketed = rng.sample(buckets, min(args.samples, len(buckets)))
    result["bucket_after_sweep"] = summary(calls(bucketed))
    return result


def sampling_probe(device: torch.device, vocab: int) -> list[dict[str, Any]]:
    """Each operator's first call at each batch size in turn (N = 1 first, as the
    engine's warm-up sampled one row at a time when this was measured)."""
    rows = []
    for n in SAMPLING_ROWS:
        logits = torch.randn(n, vocab, device=device, dtype=torch.float32)
        ops = {
            "max": lambda x=logits: x.max(dim=-1),
            "sort": lambda x=logits: x.sort(dim=-1, descending=True),
            "topk": lambda x=logits: x.topk(50, dim=-1),
            "softmax": lambda x=logits: torch.softmax(x, dim=-1),
            "cumsum": lambda x=logits: x.cumsum(dim=-1),
        }
        row: dict[str, Any] = {"rows": n}
        for name, call in ops.items():
            first, again = first_and_again(call, device)
            row[name] = [round(first, 1), round(again, 1)]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=24, help="row counts per GEMM phase")
    parser.add_argument("--bucket", type=int, default=64)
    parser.add_argument("--max-rows", type=int, default=8192)
    parser.add_argument("--blas", nargs="+", default=["cublas", "cublaslt"])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results root")
    parser.add_argument("--name", help="the result's file stem (default: the hardware)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)

    sampling = sampling_probe(device, args.vocab)
    taken: set[int] = set()
    gemm = {blas: gemm_probe(args, device, blas, taken) for blas in args.blas}

    lines = [
        "# What a first use costs on the host",
        "",
        f"Qwen3-8B layer GEMMs (bf16) at row counts up to {args.max_rows}: host µs of a "
        "call the first time its shape is met, and again right after (median; max).",
        "",
        "| BLAS | phase | calls | first µs (max) | again µs | extra ms in all |",
        "|---|---|---|---|---|---|",
    ]
    for blas, phases in gemm.items():
        sweep = phases["sweep"]
        for phase in ("fresh", "fresh_after_sweep", "bucket_after_sweep"):
            s = phases[phase]
            lines.append(
                f"| {blas} | {phase} | {s['calls']} | {s['first_median_us']:.0f} "
                f"({s['first_max_us']:.0f}) | {s['again_median_us']:.0f} | "
                f"{s['extra_total_ms']:.1f} |"
            )
        lines.append(
            f"| {blas} | sweep of {sweep['buckets']} buckets x 4 shapes | | "
            f"{sweep['seconds']:.2f} s | | |"
        )
    names = [k for k in sampling[0] if k != "rows"]
    lines += [
        "",
        f"Sampler operators over [N, {args.vocab}] float32, N = 1 first: host µs of the "
        "first call at each N / again.",
        "",
        "| N | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for row in sampling:
        lines.append(
            f"| {row['rows']} | "
            + " | ".join(f"{row[k][0]:.0f} / {row[k][1]:.0f}" for k in names)
            + " |"
        )
    doc = {
        "environment": environment(),
        "args": vars(args) | {"out": str(args.out)},
        "gemm": gemm,
        "sampling": sampling,
    }
    table = "\n".join(lines)
    write_results(args.out, "first_use_gpu", doc, table, args.name or hardware(args.device))
    print(table)


if __name__ == "__main__":
    main()
