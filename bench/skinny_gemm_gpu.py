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

``--sweep`` instead times, at one row (batch-1 decode), every launch configuration of
:func:`sweep_configs` on every shape against torch, then the 3 fastest again with the
weight loads ``evict_first``, with programmatic dependent launch (the calls of a graph
then overlap: each lets the next start and fetch its first weight tile), and with both,
and writes the fastest few per shape to ``skinny_gemm_sweep.json`` / ``.md``.

Usage: python bench/skinny_gemm_gpu.py [--out bench/results] [--reps 5] [--no-alt]
       python bench/skinny_gemm_gpu.py --sweep [--out bench/results]
       python bench/skinny_gemm_gpu.py --smoke --device cpu --out /tmp/skinny [--sweep]
"""

from __future__ import annotations

import argparse
import dataclasses
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
# tried on the sweep's 3 fastest configs per shape (CUDA only)
REFINEMENTS = (
    {"weight_eviction": "evict_first"},
    {"pdl": True},
    {"weight_eviction": "evict_first", "pdl": True},
)


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

    from jacana_engine.tuning.gpu_timing import replay_seconds

    for i in range(calls):  # warm-up outside the capture
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    per_call = [replay_seconds(graph, replays) * 1e6 / calls for _ in range(reps)]
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


def sweep_configs(kernel, smoke: bool = False) -> list:
    """One-row launch configurations to try: the broadcast-and-sum inner product with
    BLOCK_N x BLOCK_K tiles up to 64 fp32 accumulators per thread, 4 or 8 warps, 3 or 4
    pipeline stages (2 x 2 x 1 x 1 tiny ones for a smoke run)."""
    tiles = [(bn, bk) for bn in (2, 4, 8, 16, 32) for bk in (256, 512, 1024, 2048)]
    warps, stages = (4, 8), (3, 4)
    if smoke:
        tiles, warps, stages = [(2, 32), (4, 64)], (4,), (3,)
    return [
        kernel.SkinnyConfig(1, bn, bk, False, num_warps=w, num_stages=st)
        for bn, bk in tiles
        for w in warps
        for st in stages
        if bn * bk <= 64 * 32 * w
    ]


def sweep(args: argparse.Namespace) -> dict:
    """Every :func:`sweep_configs` entry on every shape at M = 1, against torch."""
    import torch

    kernel = _load_kernel(args)
    device = torch.device(args.device)
    shapes = SMOKE_SHAPES if args.smoke else kernel.QWEN3_SHAPES
    configs = sweep_configs(kernel, args.smoke)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    results = []
    for name, (k, n) in shapes.items():
        row = _sweep_shape(kernel, name, k, n, configs, device, args)
        results.append(row)
        best = row["fastest"][0]
        print(
            f"[sweep] {name:13s} torch {row['torch_us']:.2f} us, best {best['us']:.2f} us "
            f"{best['config']}",
            flush=True,
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {
        **_header("skinny_gemm_sweep", args),
        "configs_tried": len(configs),
        "calls_per_graph": args.calls,
        "replays": args.replays,
        "wall_s": time.perf_counter() - t0,
        "results": results,
    }


def _sweep_shape(kernel, name: str, k: int, n: int, configs: list, device, args) -> dict:
    import torch
    import torch.nn.functional as F

    dtype = torch.bfloat16
    weight_bytes = n * k * dtype.itemsize
    copies = 1 if args.smoke else min(args.calls, -(-L2_FLUSH_BYTES // weight_bytes))
    weights = [_random((n, k), k**-0.5, dtype, device) for _ in range(copies)]  # [N, K] each
    x = _random((1, k), 1.0, dtype, device)  # [1, K]
    outs = [torch.empty(1, n, dtype=dtype, device=device) for _ in weights]
    ref = F.linear(x.float(), weights[0].float())  # [1, N]
    scale = float(ref.abs().max().clamp_min(1e-30))
    timer = _time_graph if device.type == "cuda" else _time_eager

    def torch_call(i):
        return F.linear(x, weights[i % copies])

    torch_us = statistics.median(timer(torch_call, args.calls, args.replays, 3))

    def timed(cfg) -> dict:
        def call(i):
            return kernel.skinny_linear(x, weights[i % copies], outs[i % copies], config=cfg)

        err = float((call(0).float() - ref).abs().max()) / scale
        us = statistics.median(timer(call, args.calls, args.replays, 3))
        return {"config": vars(cfg), "us": us, "rel_err": err}

    tried = sorted((timed(cfg) for cfg in configs), key=lambda t: t["us"])
    if device.type == "cuda":  # the 3 fastest again: weights evict_first, PDL, both
        refine = [kernel.SkinnyConfig(**t["config"]) for t in tried[:3]]
        tried += [
            timed(dataclasses.replace(cfg, **change)) for cfg in refine for change in REFINEMENTS
        ]
        tried.sort(key=lambda t: t["us"])
    return {
        "shape": name,
        "k": k,
        "n": n,
        "torch_us": torch_us,
        "torch_gbps": weight_bytes / (torch_us * 1e3),
        "best_gbps": weight_bytes / (tried[0]["us"] * 1e3),
        "picked": vars(kernel.pick_config(1, n, k)),
        "fastest": tried[:5],
        "worst_rel_err": max(t["rel_err"] for t in tried),
    }


def render_sweep(doc: dict) -> str:
    lines = [
        f"# Skinny GEMM launch sweep at one row ({doc['environment'].get('gpu', doc['device'])})",
        "",
        f"bfloat16, M = 1; {doc['configs_tried']} configurations per shape (broadcast-and-sum "
        f"inner product), {doc['calls_per_graph']} calls per CUDA graph x {doc['replays']} "
        "replays, median of 3; weights rotated past L2. Config: BLOCK_N, BLOCK_K, warps, "
        f"stages. {doc['date']}",
        "",
        "| shape | K->N | torch us | torch GB/s | best us | best GB/s | torch/best | best "
        "config | runner-up configs (us) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        best = r["fastest"][0]

        def cfg(c):
            flags = (" pdl" if c.get("pdl") else "") + (
                " " + c["weight_eviction"] if c.get("weight_eviction") else ""
            )
            return f"{c['block_n']},{c['block_k']},{c['num_warps']},{c['num_stages']}{flags}"

        others = ", ".join(f"{cfg(t['config'])} ({t['us']:.2f})" for t in r["fastest"][1:4])
        lines.append(
            f"| {r['shape']} | {r['k']}->{r['n']} | {r['torch_us']:.2f} | {r['torch_gbps']:.0f} "
            f"| {best['us']:.2f} | {r['best_gbps']:.0f} | {r['torch_us'] / best['us']:.2f} "
            f"| {cfg(best['config'])} | {others} |"
        )
    worst = max(r["worst_rel_err"] for r in doc["results"])
    lines += ["", f"Worst max|err| / max|fp32 ref| over every configuration: {worst:.2e}."]
    return "\n".join(lines) + "\n"


def _header(benchmark: str, args: argparse.Namespace) -> dict:
    """The fields every result document of this script starts with."""
    return {
        "benchmark": benchmark,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "environment": environment(),
        "device": args.device,
        "smoke": args.smoke,
    }


def _load_kernel(args: argparse.Namespace):
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available here (use --smoke --device cpu)")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module loads
    return import_kernel()


def measure(args: argparse.Namespace) -> dict:
    import torch

    kernel = _load_kernel(args)
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
        **_header("skinny_gemm_gpu", args),
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
    parser.add_argument("--sweep", action="store_true", help="launch configurations at M = 1")
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.replays, args.reps = 2, 1, 3
    elif args.reps < 3:
        parser.error("--reps must be at least 3 (medians with spread)")
    name = "skinny_gemm_sweep" if args.sweep else "skinny_gemm_gpu"
    doc = sweep(args) if args.sweep else measure(args)
    table = render_sweep(doc) if args.sweep else render(doc)
    write_results(args.out, name, doc, table)
    print(table)
    print(f"[bench] wrote {args.out}/{name}.json and .md")


if __name__ == "__main__":
    main()
