"""Does a gated down projection that starts on gate_up's chunks as they are stored beat
one that waits for the whole gate_up kernel (batch-1 decode)?

The chain of ``layer_stream_probe_gpu.py`` (``--layers`` Qwen3-8B-shaped layers of [o ->
add + RMSNorm -> gate_up -> down gated -> add + RMSNorm -> qkv], each with its own random
bf16 weights, the engine's kernels with PDL on the in-graph picks) in one CUDA graph,
against the same chain with each layer's gate_up and down as a ``ChunkFlags`` pair
(``kernels/skinny_gemm.py``): gate_up's programs mark each chunk of its output once
stored, and the down's programs, launched early by PDL, wait for each chunk's mark
before its x tile instead of for the whole gate_up grid. The same sums: the check runs
one layer both ways and compares bits.

Variants also try down configs that hold more weight in flight (two tiles before the
first wait, ``lookahead``) and a 512-column chunk; and, to split the cost, the down
launched without PDL (it starts once gate_up has finished) with and without the flags:
what the waits cost when every chunk is already marked.

Usage: python bench/chunk_flags_probe_gpu.py [--out DIR] [--layers 36] [--reps 5]
Writes ``chunk_flags_probe_gpu.json`` / ``.md``. Needs an sm90 GPU (PDL).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

import torch
from common import RESULTS_DIR, environment, fmt_spread, spread, write_results
from layer_stream_probe_gpu import EPS, INTER, PICKS, QKV, Chain, H, capture

from jacana_engine.gpu_timing import replay_seconds
from jacana_engine.kernels.rmsnorm import fused_add_rms_norm
from jacana_engine.kernels.skinny_gemm import SkinnyConfig, chunk_flags, skinny_linear

DOWN = PICKS["down"]
NO_PDL = dataclasses.replace(DOWN, pdl=False)
VARIANTS = {  # name: (gate_up config, down config, chunk flags between them)
    "flags, picks": (PICKS["gate_up"], DOWN, True),
    "flags, down +2 tiles": (PICKS["gate_up"], dataclasses.replace(DOWN, prefetch_tiles=2), True),
    "flags, down ahead": (PICKS["gate_up"], dataclasses.replace(DOWN, lookahead=True), True),
    "flags, down 8x512 +2 ahead": (
        PICKS["gate_up"],
        SkinnyConfig(1, 8, 512, False, pdl=True, prefetch_tiles=2, lookahead=True),
        True,
    ),
    "down without PDL": (PICKS["gate_up"], NO_PDL, False),
    "down without PDL, flags": (PICKS["gate_up"], NO_PDL, True),
}


class FlagChain(Chain):
    """``Chain`` whose layers can run gate_up and down as a chunk-flag pair."""

    def __init__(self, layers: int) -> None:
        super().__init__(layers)
        dev = torch.device("cuda")
        self.flags = {
            name: [chunk_flags(p, c, INTER, dev, gated=True) if on else None for _ in self.layers]
            for name, (p, c, on) in VARIANTS.items()
        }

    def layer_flags(self, i: int, w: dict, variant: str) -> None:
        """``layer_separate`` with gate_up -> down as ``variant``'s chunk-flag pair."""
        producer, consumer, _ = VARIANTS[variant]
        flags = self.flags[variant][i]
        attn = self.qkv[:, :H]
        res_in, res_out = self.res[i % 2], self.res[(i + 1) % 2]
        o = skinny_linear(attn, w["wo"], self.o, config=PICKS["o"])
        normed, h1 = fused_add_rms_norm(
            o, res_in, w["g_post"], EPS, out=self.normed, residual_out=res_out, pdl=True
        )
        skinny_linear(normed, w["wgu"], self.gu, config=producer, signal=flags)
        skinny_linear(self.gu, w["wd"], self.d, config=consumer, gated=True, await_chunks=flags)
        normed2, _ = fused_add_rms_norm(
            self.d, h1, w["g_next"], EPS, out=self.normed, residual_out=res_out, pdl=True
        )
        skinny_linear(normed2, w["wqkv"], self.qkv, config=PICKS["qkv"])

    def step(self, variant: str) -> None:
        for i, w in enumerate(self.layers):
            if variant == "separate":
                self.layer_separate(i, w)
            else:
                self.layer_flags(i, w, variant)


def check(chain: FlagChain, variant: str) -> dict:
    """Two layers both ways from the same inputs: bit-equal qkv and residual, flags zero."""
    qkv0, res0 = chain.qkv.clone(), chain.res[0].clone()
    outs = {}
    for v in ("separate", variant):
        chain.qkv.copy_(qkv0)
        chain.res[0].copy_(res0)
        for t in (chain.gu, chain.d, chain.res[1]):
            t.fill_(float("nan"))
        for i in range(2):
            w = chain.layers[i]
            chain.layer_separate(i, w) if v == "separate" else chain.layer_flags(i, w, v)
        torch.cuda.synchronize()
        outs[v] = (chain.qkv.clone(), chain.res[0].clone())
    chain.qkv.copy_(qkv0)
    chain.res[0].copy_(res0)
    a, b = outs["separate"], outs[variant]
    return {
        "bits_equal": bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])),
        "flags_zero": not any(f is not None and f.flags.any() for f in chain.flags[variant]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--name", default="chunk_flags_probe_gpu")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("needs a CUDA GPU of compute capability 9.0 or later (PDL)")
    chain = FlagChain(args.layers)
    checks = {v: check(chain, v) for v in VARIANTS}
    print("checks", checks, flush=True)
    variants = ["separate", *VARIANTS]
    graphs = {v: capture(lambda v=v: chain.step(v)) for v in variants}
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.reps):  # interleaved
        for v in variants:
            times[v].append(replay_seconds(graphs[v], args.replays) * 1e6 / args.layers)
        print({v: round(t[-1], 2) for v, t in times.items()}, flush=True)
    checks_after = {
        v: not any(f is not None and f.flags.any() for f in chain.flags[v]) for v in VARIANTS
    }
    layer_bytes = (H * H + 2 * INTER * H + H * INTER + QKV * H) * 2
    base = statistics.median(times["separate"])
    rows = {
        v: {
            "us_per_layer": spread(t),
            "tb_s": layer_bytes / statistics.median(t) / 1e6,
            "saved_per_step_us": (base - statistics.median(t)) * 36,
            "check": checks.get(v),
        }
        for v, t in times.items()
    }
    doc = {
        "benchmark": args.name,
        "environment": environment(),
        "device": torch.cuda.get_device_name(),
        "settings": vars(args) | {"out": str(args.out)},
        "flags_zero_after_timing": checks_after,
        "variants": rows,
    }
    lines = [
        "# gate_up -> down as a chunk-flag pair against the whole-kernel wait (batch 1)",
        "",
        f"{args.layers} Qwen3-8B-shaped layers [o, add+norm, gate_up, down gated, add+norm, "
        f"qkv] per CUDA graph, {layer_bytes / 1e6:.1f} MB of weights a layer; median "
        f"(min–max) of {args.reps} reps of {args.replays} replays. {doc['device']}.",
        "",
        "| variant | µs a layer | TB/s | saved a step (36 layers) µs | bits equal |",
        "|---|---|---|---|---|",
    ]
    for v, r in rows.items():
        c = r["check"] or {}
        lines.append(
            f"| {v} | {fmt_spread(r['us_per_layer'])} | {r['tb_s']:.2f} | "
            f"{r['saved_per_step_us']:.0f} | {c.get('bits_equal', '-')} |"
        )
    write_results(args.out, args.name, doc, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
