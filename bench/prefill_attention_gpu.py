"""The paged prefill attention kernel's launch settings at Qwen3-8B head shapes on a GPU.

Times ``kernels.prefill_attention.paged_prefill_attention`` alone (CUDA events, median of
``--reps`` runs of ``--calls`` calls) for the prompts a server prefills: one 1024-token
prompt (TTFT), four 2048-token prompts, and eight 512-token chunks after a 4096-token
cached prefix; with the kernel's own choice (``block_m`` from ``choose_block_m``, the
module's tile and launch settings), then with each alternative in ``CONFIGS``. Every
config's output is checked against the default's
(fresh random bf16 inputs, never zeros). Reported: ms per call and attention TFLOP/s
(causal: each query attends its prefix and itself).

``--smoke --device cpu`` runs one tiny shape under Triton's interpreter to check the
script itself.

Usage: python bench/prefill_attention_gpu.py [--out DIR] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from common import RESULTS_DIR, environment, write_results

# (name, sequences, new tokens each, cached prefix each)
CASES = [("1x1024", 1, 1024, 0), ("4x2048", 4, 2048, 0), ("8x512 after 4096", 8, 512, 4096)]
SMOKE_CASES = [("2x40 after 16", 2, 40, 16)]
# block_m (the call's argument; None: the kernel's choice), then the module's _BLOCK_N,
# _NUM_WARPS, _NUM_STAGES
CONFIGS = [
    (128, 32, 4, 3),
    (64, 32, 4, 3),
    (128, 64, 8, 2),
    (128, 64, 4, 2),
    (64, 64, 4, 2),
    (128, 32, 8, 3),
]
SETTINGS = ("_BLOCK_N", "_NUM_WARPS", "_NUM_STAGES")


def make_case(seqs: int, new: int, prefix: int, device: str, heads=(32, 8, 128), block=16):
    """Random q and a KV cache holding every sequence's prefix and new tokens; returns the
    kernel's arguments and the attention FLOPs of one call."""
    import torch

    n_heads, n_kv, head_dim = heads
    total = prefix + new
    blocks_each = -(-total // block)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=torch.bfloat16)

    kv = rand(2, seqs * blocks_each + 1, block, n_kv, head_dim)
    # every sequence's blocks, scattered over the pool
    order = torch.randperm(seqs * blocks_each, generator=gen) + 1
    tables = order.view(seqs, blocks_each).to(device=device, dtype=torch.int32)
    q = rand(seqs * new, n_heads, head_dim)
    qsl = torch.arange(0, seqs * new + 1, new, dtype=torch.int32, device=device)
    seq_lens = torch.full((seqs,), total, dtype=torch.int32, device=device)
    keys = sum(prefix + j + 1 for j in range(new))  # per sequence and head
    flops = 4 * seqs * n_heads * head_dim * keys
    return (q, kv, qsl, seq_lens, tables), new, flops


def time_calls(fn, calls: int, reps: int, device: str, warm_s: float = 0.2) -> float:
    """Median seconds per call, after ``warm_s`` of calls (on a GPU): the first config
    timed on a fresh machine otherwise reads up to a quarter slower while clocks settle."""
    import torch

    fn()
    if device == "cpu":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    torch.cuda.synchronize()
    end_warm = time.perf_counter() + warm_s
    while time.perf_counter() < end_warm:
        fn()
        torch.cuda.synchronize()
    from jacana_engine.tuning.gpu_timing import call_seconds

    return statistics.median(call_seconds(fn, calls) for _ in range(reps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import functools

    from jacana_engine.kernels import prefill_attention as kernel

    defaults = (None, *(getattr(kernel, s) for s in SETTINGS))
    configs = [defaults, *CONFIGS]
    if args.smoke:
        configs = configs[:2]
    rows: list[dict[str, Any]] = []
    for name, seqs, new, prefix in SMOKE_CASES if args.smoke else CASES:
        heads = (4, 2, 16) if args.smoke else (32, 8, 128)
        inputs, max_q, flops = make_case(seqs, new, prefix, args.device, heads)
        reference = None
        for config in configs:
            for setting, value in zip(SETTINGS, config[1:], strict=True):
                setattr(kernel, setting, value)
            call = functools.partial(
                kernel.paged_prefill_attention,
                *inputs,
                0.088,
                max_query_len=max_q,
                block_m=config[0],
            )
            out = call()
            if reference is None:
                reference = out.float()
            err = (out.float() - reference).abs().max().item()
            seconds = time_calls(call, args.calls, args.reps, args.device)
            rows.append(
                {
                    "case": name,
                    "config": dict(zip(("block_m", *SETTINGS), config, strict=True)),
                    "default": config == defaults,
                    "ms": 1e3 * seconds,
                    "tflops": flops / seconds / 1e12,
                    "max_abs_diff_vs_default": err,
                }
            )
            print(rows[-1], flush=True)
        for setting, value in zip(SETTINGS, defaults[1:], strict=True):
            setattr(kernel, setting, value)
    lines = [
        "# Paged prefill attention: launch settings at Qwen3-8B head shapes",
        "",
        f"{args.device}; median of {args.reps} runs of {args.calls} calls; "
        "block_m / BLOCK_N / warps / stages; the kernel's own choice (block_m None: "
        "``choose_block_m``) marked *.",
        "",
        "| case | config | ms | TFLOP/s | max abs diff vs default |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['case']} | {'/'.join(str(v) for v in r['config'].values())}"
        f"{' *' if r['default'] else ''} | {r['ms']:.3f} | {r['tflops']:.1f} | "
        f"{r['max_abs_diff_vs_default']:.1e} |"
        for r in rows
    ]
    table = "\n".join(lines)
    doc = {"environment": environment(), "reps": args.reps, "calls": args.calls, "rows": rows}
    write_results(args.out, "prefill_attention_gpu", doc, table)
    print(table)


if __name__ == "__main__":
    main()
