"""Decode-sized linear layers on one CUDA GPU: torch.nn.functional.linear vs skinny_linear.

For each Qwen3 weight shape (K -> N) and M in (1, 2, 4, 8, 16) rows, both sides run as
``--calls`` back-to-back calls captured in one CUDA graph, replayed ``--replays`` times
between two CUDA events; a rep gives microseconds per call, and results are medians over
``--reps`` reps with min–max. The calls cycle over enough copies of the weight to exceed
the L2 cache (>= 128 MiB in all, at most ``--calls`` copies), so every weight is read from
HBM as in a real decoder. Reported: us per call, effective weight bandwidth (N * K * 2
bytes per call), and the ratio torch / skinny per rep. ``skinny_alt`` is the kernel
forced onto its other inner product (``tl.dot`` below DOT_MIN_M rows, ``tl.sum`` from
it up), to see where the switch belongs; ``--no-alt`` skips it. Inputs are fresh random
bfloat16 (never zeros); each shape is warmed up (Triton compile, cuBLAS heuristics)
before its capture, and the outputs of both sides are compared.

Imports the kernel from services/engine/src (put on sys.path when jacana_engine is not
installed). ``--smoke --device cpu`` runs tiny shapes under Triton's interpreter, timed
with perf_counter and no graphs, to check the script itself.

Writes ``skinny_gemm_gpu.json`` and ``skinny_gemm_gpu.md`` to ``--out``.

Usage: python bench/skinny_gemm_gpu.py [--out bench/results] [--reps 5] [--no-alt]
       python bench/skinny_gemm_gpu.py --smoke --device cpu --out /tmp/skinny
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

from common import RESULTS_DIR, environment, fmt_spread, spread, write_results

ROOT = Path(__file__).resolve().parents[1]
SMOKE_SHAPES = {"tiny a": (64, 40), "tiny b": (200, 96)}
ROWS = (1, 2, 4, 8, 16)
SMOKE_ROWS = (1, 3)
L2_FLUSH_BYTES = 128 << 20  # weight copies per shape add up to at least this


def import_kernel():
    """jacana_engine's skinny_gemm module (from the source tree when not installed)."""
    if importlib.util.find_spec("jacana_engine") is None:
        sys.path.insert(0, str(ROOT / "services" / "engine" / "src"))
    from jacana_engine.kernels import skinny_gemm

    return skinny_gemm


def _random(shape, scale, dtype, device):
    """Normal values, never exactly zero (a zero weight or input would flatter nothing,
    but it could hide a kernel that skips work)."""
    import torch

    t = torch.randn(shape, device=device) * scale
    return torch.where(t == 0, torch.full_like(t, 1e-3), t).to(dtype)


def _time_graph(fn, calls: int, replays: int, reps: int) -> list[float]:
    """us per call of ``fn(i)`` for i in range(calls), captured in one CUDA graph."""
    import torch

    for i in range(calls):  # warm-up outside the capture
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(reps):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / (replays * calls))
    del graph
    return per_call


def _time_eager(fn, calls: int, replays: int, reps: int) -> list[float]:
    """us per call on the host clock (CPU smoke runs: no graphs, no events)."""
    fn(0)
    per_call = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(replays):
            for i in range(calls):
                fn(i)
        per_call.append((time.perf_counter() - t0) * 1e6 / (replays * calls))
    return per_call


def measure_shape(kernel, name, k, n, m, weights, args) -> dict:
    import torch
    import torch.nn.functional as F

    device, dtype = weights[0].device, weights[0].dtype
    x = _random((m, k), 1.0, dtype, device)  # [M, K]
    outs = [torch.empty(m, n, dtype=dtype, device=device) for _ in weights]  # [M, N] each
    cfg = kernel.pick_config(m, n, k)
    alt = kernel.pick_config(m, n, k, use_dot=not cfg.use_dot)
    variants = {
        "torch": lambda i: F.linear(x, weights[i % len(weights)]),
        "skinny": lambda i: kernel.skinny_linear(x, weights[i % len(weights)], outs[i % len(outs)]),
    }
    if not args.no_alt:
        variants["skinny_alt"] = lambda i: kernel.skinny_linear(
            x, weights[i % len(weights)], outs[i % len(outs)], config=alt
        )
    timer = _time_graph if device.type == "cuda" else _time_eager
    us = {key: timer(fn, args.calls, args.replays, args.reps) for key, fn in variants.items()}

    ref = F.linear(x.float(), weights[0].float())  # [M, N]
    scale = float(ref.abs().max().clamp_min(1e-30))
    err = {key: float((fn(0).float() - ref).abs().max()) / scale for key, fn in variants.items()}
    weight_bytes = n * k * weights[0].element_size()
    row = {
        "shape": name,
        "k": k,
        "n": n,
        "m": m,
        "weight_bytes": weight_bytes,
        "weight_copies": len(weights),
        "config": vars(cfg) | {"programs": cfg.grid(n)[0]},
        "alt_config": vars(alt) | {"programs": alt.grid(n)[0]},
        "max_rel_err_vs_fp32": err,
    }
    for key, values in us.items():
        row[f"{key}_us"] = spread(values)
        row[f"{key}_gbps"] = spread([weight_bytes / (v * 1e3) for v in values])
    for key in us:
        if key != "torch":
            ratios = [t / s for t, s in zip(us["torch"], us[key], strict=True)]
            row[f"torch_over_{key}"] = spread(ratios)
    return row


def measure(args: argparse.Namespace) -> dict:
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available here (use --smoke --device cpu)")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module loads
    kernel = import_kernel()
    device = torch.device(args.device)
    dtype = torch.bfloat16
    shapes, rows = (SMOKE_SHAPES, SMOKE_ROWS) if args.smoke else (kernel.QWEN3_SHAPES, ROWS)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    results = []
    for name, (k, n) in shapes.items():
        weight_bytes = n * k * dtype.itemsize
        copies = 1 if args.smoke else min(args.calls, -(-L2_FLUSH_BYTES // weight_bytes))
        weights = [_random((n, k), k**-0.5, dtype, device) for _ in range(copies)]
        for m in rows:
            row = measure_shape(kernel, name, k, n, m, weights, args)
            results.append(row)
            print(
                f"[bench] {name:13s} M={m:2d}  torch {fmt_spread(row['torch_us'])} us  "
                f"skinny {fmt_spread(row['skinny_us'])} us  "
                f"({row['torch_over_skinny']['median']:.2f}x)",
                flush=True,
            )
        del weights
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {
        "benchmark": "skinny_gemm_gpu",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "environment": environment(),
        "device": args.device,
        "smoke": args.smoke,
        "dtype": "bfloat16",
        "calls_per_graph": args.calls,
        "replays": args.replays,
        "reps": args.reps,
        "seed": args.seed,
        "dot_min_m": kernel.DOT_MIN_M,
        "target_programs": kernel.TARGET_PROGRAMS,
        "wall_s": time.perf_counter() - t0,
        "results": results,
    }


def render(doc: dict) -> str:
    alt = any("skinny_alt_us" in r for r in doc["results"])
    lines = [
        f"# Skinny GEMM vs torch linear ({doc['environment'].get('gpu', doc['device'])})",
        "",
        f"bfloat16; {doc['calls_per_graph']} calls per CUDA graph x {doc['replays']} "
        f"replays; median (min–max) over {doc['reps']} reps; GB/s = weight bytes / time; "
        f"weights rotated over copies >= 128 MiB to defeat L2. {doc['date']}",
        "",
        "| shape | K->N | M | config (BM,BN,BK,dot,progs) | torch us | skinny us | torch GB/s "
        "| skinny GB/s | torch/skinny |" + (" alt us | torch/alt |" if alt else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if alt else ""),
    ]
    for r in doc["results"]:
        c = r["config"]
        cfg = f"{c['block_m']},{c['block_n']},{c['block_k']},{int(c['use_dot'])},{c['programs']}"
        line = (
            f"| {r['shape']} | {r['k']}->{r['n']} | {r['m']} | {cfg} | "
            f"{fmt_spread(r['torch_us'])} | {fmt_spread(r['skinny_us'])} | "
            f"{fmt_spread(r['torch_gbps'], 0)} | {fmt_spread(r['skinny_gbps'], 0)} | "
            f"{fmt_spread(r['torch_over_skinny'])} |"
        )
        if alt:
            line += (
                f" {fmt_spread(r['skinny_alt_us'])} | {fmt_spread(r['torch_over_skinny_alt'])} |"
            )
        lines.append(line)
    worst = {
        key: max(r["max_rel_err_vs_fp32"].get(key, 0.0) for r in doc["results"])
        for key in doc["results"][0]["max_rel_err_vs_fp32"]
    }
    ratios = [r["torch_over_skinny"]["median"] for r in doc["results"]]
    lines += [
        "",
        f"Median torch/skinny over all rows: {statistics.median(ratios):.2f}x "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f}). Worst max|err| / max|fp32 ref|: "
        + ", ".join(f"{key} {value:.2e}" for key, value in worst.items())
        + f". Wall time {doc['wall_s']:.1f} s.",
    ]
    if doc["smoke"]:
        lines.append(
            "Smoke run: tiny shapes under Triton's interpreter, host-timed; its bfloat16 "
            "tl.dot is broken there, so large skinny_alt errors are expected."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50, help="calls captured per graph")
    parser.add_argument("--replays", type=int, default=20, help="graph replays per rep")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-alt", action="store_true", help="skip the other inner product")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, few calls")
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.replays, args.reps = 2, 1, 3
    elif args.reps < 3:
        parser.error("--reps must be at least 3 (medians with spread)")
    doc = measure(args)
    table = render(doc)
    write_results(args.out, "skinny_gemm_gpu", doc, table)
    print(table)
    print(f"[bench] wrote {args.out}/skinny_gemm_gpu.json and .md")


if __name__ == "__main__":
    main()
