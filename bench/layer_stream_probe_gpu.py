"""Does one persistent launch per layer stream a batch-1 decode layer's weights faster?

A chain of ``--layers`` Qwen3-8B-shaped layers, each [o_proj -> add + RMSNorm -> gate_up
-> SiLU-and-mul -> down -> add + RMSNorm -> the next qkv], every layer with its own
random bf16 weights (385.9 MB a layer), captured in one CUDA graph two ways:

- ``separate``: the engine's decode kernels as a batch-1 graph runs them: four skinny
  GEMV launches and two norm launches with PDL (the in-graph picks of the last run:
  o 8x1024, gate_up 2x2048, down gated 8x1024, qkv 2x2048);
- ``stream``: ``layer_stream.py``, one launch a layer, its weight loads software
  pipelined by Triton inside the loop that consumes them;
- ``ws``: ``layer_stream_ws.py``, the same chain in Gluon with one producer warp a
  program that streams tiles by TMA into a ring of shared-memory slots whatever the
  consumer warps are doing (across the grid barriers too);
- ``dyn``: as ``ws``, with the row blocks of each matrix handed out at run time from a
  counter instead of in fixed shares.

Each program of ``stream`` and ``ws`` takes one contiguous share of each matrix's row
blocks, so at any moment the grid reads as many places far apart; the "interleaved"
variants deal the row blocks out in turn, so the grid reads one narrow window that moves
through the matrix, as the separate kernels' grids of many short programs do (and the
lm_head GEMV, which streams at ~4.48 TB/s against the stream's ~4.1).

The "L2 n ahead" variants of ``stream`` also ask L2, at each step, for the tile n steps
on, so that HBM keeps streaming while a program waits at a grid barrier (its pipelined
loads stop there).

Timing-only variants leave out the grid barriers' waits ("no waits": wrong results) or
the consumers' arithmetic ("no arithmetic"), to split a layer's time.

The next layer's attention output is stood in for by the qkv output's first H values
(no attention kernel in either chain). Before timing, one layer runs both ways on the
same inputs, with the stream's scratch poisoned with NaN, and the outputs are compared;
the stream's launch runs three times to check that its barrier counter resets.

Usage: python bench/layer_stream_probe_gpu.py [--out DIR] [--layers 36] [--reps 5]
Writes ``layer_stream_probe_gpu.json`` / ``.md``. Needs an sm90 GPU (PDL).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from common import RESULTS_DIR, environment, fmt_spread, spread, write_results
from layer_stream import StreamConfig, layer_stream
from layer_stream_ws import layer_stream_dyn, layer_stream_ws

from jacana_engine.kernels.rmsnorm import fused_add_rms_norm
from jacana_engine.kernels.skinny_gemm import (
    NormPrologue,
    ResidualStats,
    SkinnyConfig,
    skinny_linear,
    stats_columns,
    stats_config,
)
from jacana_engine.layers.norm import fold_norm_weight
from jacana_engine.tuning.gpu_timing import replay_seconds

H, INTER, QKV = 4096, 12288, 6144
EPS = 1e-6
PICKS = {
    "o": SkinnyConfig(1, 8, 1024, False, pdl=True),
    "gate_up": SkinnyConfig(1, 2, 2048, False, pdl=True),
    "down": SkinnyConfig(1, 8, 1024, False, pdl=True),
    "qkv": SkinnyConfig(1, 2, 2048, False, pdl=True),
}
CONFIGS = {  # name: rows a tile x pipeline depth, warps, register cap, programs per SM
    "stream 8x3": StreamConfig(block_n=8, stages=3, per_sm=1),
    "stream 8x3, no waits": StreamConfig(block_n=8, stages=3, per_sm=1, wait=0),
    "stream 8x3 interleaved": StreamConfig(block_n=8, stages=3, per_sm=1, interleave=True),
    "stream 8x3 interleaved, no waits": StreamConfig(
        block_n=8, stages=3, per_sm=1, wait=0, interleave=True
    ),
    **{
        f"stream 8x3, L2 {ahead} ahead": StreamConfig(block_n=8, stages=3, per_sm=1, l2_ahead=ahead)
        for ahead in (4, 6, 8)
    },
    "stream 8x3, L2 6 ahead, no waits": StreamConfig(
        block_n=8, stages=3, per_sm=1, wait=0, l2_ahead=6
    ),
}
WS_CONFIGS = {  # bench/layer_stream_ws.py: rows a tile, ring slots, consumer warps, register cap,
    # barriers wait, tiles multiplied (these two off: timing only), row blocks interleaved
    "ws 8x3": (8, 3, 8, None, True, True, False),
    "ws 8x3, no waits": (8, 3, 8, None, False, True, False),
    "ws 8x3, no arithmetic": (8, 3, 8, None, True, False, False),
    "ws 8x3, no waits, no arithmetic": (8, 3, 8, None, False, False, False),
    "ws 8x3 interleaved": (8, 3, 8, None, True, True, True),
    "ws 8x3 interleaved, no waits": (8, 3, 8, None, False, True, True),
    "ws 8x3 interleaved, no waits, no arithmetic": (8, 3, 8, None, False, False, True),
}
DYN_CONFIGS = {"dyn 8x3": (8, 3, 8)}  # layer_stream_dyn: rows a tile, ring slots, consumer warps


# (shape name, x, weight, out, gated=False) -> out: one GEMV of a layer, however launched
Gemv = Callable[..., torch.Tensor]


def skinny_gemv(picks: dict[str, SkinnyConfig]) -> Gemv:
    """The engine's skinny kernel with one launch config per shape name."""

    def gemv(name: str, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, gated=False):
        config = picks[name]
        if config.activates:  # gate_up's launch stores silu(gate) * up: half of ``out``
            out = out[:, : out.shape[1] // 2]
        return skinny_linear(x, weight, out, config=config, gated=gated)

    return gemv


class Chain:
    def __init__(self, layers: int) -> None:
        dev = torch.device("cuda")

        def weight(n: int, k: int) -> torch.Tensor:
            return (torch.randn(n, k, device=dev) * k**-0.5).to(torch.bfloat16)

        self.layers = [
            {
                "wo": weight(H, H),
                "wgu": weight(2 * INTER, H),
                "wd": weight(H, INTER),
                "wqkv": weight(QKV, H),
                "g_post": (1 + 0.1 * torch.randn(H, device=dev)).to(torch.bfloat16),
                "g_next": (1 + 0.1 * torch.randn(H, device=dev)).to(torch.bfloat16),
            }
            for _ in range(layers)
        ]
        bf = dict(device=dev, dtype=torch.bfloat16)
        self.qkv = torch.randn(1, QKV, **bf)
        self.res = [torch.randn(1, H, **bf), torch.empty(1, H, **bf)]
        self.o, self.gu, self.d = (
            torch.empty(1, H, **bf),
            torch.empty(1, 2 * INTER, **bf),
            torch.empty(1, H, **bf),
        )
        self.normed = torch.empty(1, H, **bf)
        # the deferred layers' residual epilogues store per-program partial sums here (unread)
        self.stats = torch.empty(1, H, device=dev, dtype=torch.float32)

    def layer_separate(self, i: int, w: dict, gemv: Gemv | None = None, pdl: bool = True) -> None:
        """One layer of separate launches: ``gemv`` runs its four GEMVs (by default the
        skinny kernel with ``PICKS``), the norms launch with PDL where ``pdl``."""
        gemv = gemv or skinny_gemv(PICKS)
        attn = self.qkv[:, :H]
        res_in, res_out = self.res[i % 2], self.res[(i + 1) % 2]
        o = gemv("o", attn, w["wo"], self.o)
        normed, h1 = fused_add_rms_norm(
            o, res_in, w["g_post"], EPS, out=self.normed, residual_out=res_out, pdl=pdl
        )
        up = gemv("gate_up", normed, w["wgu"], self.gu)  # [1, 2 * INTER], or activated
        gemv("down", up, w["wd"], self.d, gated=up.shape[1] == 2 * INTER)
        normed2, _ = fused_add_rms_norm(
            self.d, h1, w["g_next"], EPS, out=self.normed, residual_out=res_out, pdl=pdl
        )
        gemv("qkv", normed2, w["wqkv"], self.qkv)

    def layer_deferred(self, w: dict, picks: dict[str, SkinnyConfig] = PICKS) -> None:
        """One layer with no norm launches (``NormPrologue.deferred``): o_proj and down add
        the residual in their epilogue, in place in ``res[0]``; gate_up and qkv take the
        norm's weight as x loads and 1/rms after the product. Two dependencies a layer
        fewer than ``layer_separate``, on the same one-row picks."""
        self._layer_without_norm_launches(
            w, picks, lambda g, stats: NormPrologue(g, EPS, deferred=True)
        )

    def fold_norm_weights(self) -> None:
        """Give every layer gate_up's and qkv's weights with the norm before each folded
        into their columns (``fold_norm_weight``), for ``layer_prefolded`` (9 GB more at
        36 layers; made once, outside any capture)."""
        for w in self.layers:
            w.setdefault("wgu_folded", fold_norm_weight(w["wgu"], w["g_post"]))
            w.setdefault("wqkv_folded", fold_norm_weight(w["wqkv"], w["g_next"]))

    def layer_prefolded(
        self,
        w: dict,
        picks: dict[str, SkinnyConfig] = PICKS,
        residual: bool = True,
        deferred: bool = True,
    ) -> None:
        """One layer with no norm launches and the norms' weights in gate_up's and qkv's
        (``fold_norm_weights`` first): o_proj and down add the residual in place in
        ``res[0]`` (``then_residual``), gate_up and qkv scale their product by 1/rms of
        x, whose squares they sum as it loads (``NormPrologue(None, eps, deferred=True)``).
        Two dependencies a layer fewer than ``layer_separate`` and, unlike
        ``layer_deferred``, nothing read or multiplied beyond x and the weight. With
        ``residual`` or ``deferred`` off (timing only, wrong results), that half is left
        out: o and down store their product, or gate_up and qkv take x as it is."""
        h, attn = self.res[0], self.qkv[:, :H]
        norm = NormPrologue(None, EPS, deferred=True) if deferred else None
        tail = h if residual else None
        wgu, wqkv = (w["wgu_folded"], w["wqkv_folded"]) if deferred else (w["wgu"], w["wqkv"])
        skinny_linear(attn, w["wo"], h, config=picks["o"], then_residual=tail)
        skinny_linear(h, wgu, self.gu, config=picks["gate_up"], norm=norm)
        skinny_linear(self.gu, w["wd"], h, config=picks["down"], gated=True, then_residual=tail)
        skinny_linear(h, wqkv, self.qkv, config=picks["qkv"], norm=norm)

    def layer_split(self, w: dict, picks: dict[str, SkinnyConfig] = PICKS) -> None:
        """One layer with no norm launches and the norm kernel's bits
        (``NormPrologue.stats``): o_proj and down, on ``stats_config``'s tiles, add the
        residual in their epilogue and store each program's sum of squares of it in
        torch's order; gate_up and qkv add those up and normalize x as it loads."""
        self._layer_without_norm_launches(
            w, picks, lambda g, stats: NormPrologue(g, EPS, stats=stats)
        )

    def _layer_without_norm_launches(
        self, w: dict, picks: dict[str, SkinnyConfig], prologue: Callable
    ) -> None:
        """o_proj and down add the residual in place in ``res[0]`` with their statistics;
        gate_up and qkv run ``prologue(norm weight, statistics)``'s norm."""
        h, attn = self.res[0], self.qkv[:, :H]
        stats = self.stats[:, : stats_columns(H, 1)]
        tail = ResidualStats(h, stats)
        o, down = (stats_config(picks[name], H, 1) for name in ("o", "down"))
        skinny_linear(attn, w["wo"], h, config=o, then_stats=tail)
        norm = prologue(w["g_post"], stats)
        skinny_linear(h, w["wgu"], self.gu, config=picks["gate_up"], norm=norm)
        skinny_linear(self.gu, w["wd"], h, config=down, gated=True, then_stats=tail)
        norm = prologue(w["g_next"], stats)
        skinny_linear(h, w["wqkv"], self.qkv, config=picks["qkv"], norm=norm)

    def layer_without_norms(self, w: dict, gemv: Gemv) -> None:
        """Timing only (wrong results): the layer's four GEMVs with nothing between them,
        what any way of fusing the norms could at best come to on these launches."""
        attn = self.qkv[:, :H]
        gemv("o", attn, w["wo"], self.o)
        gemv("gate_up", self.o, w["wgu"], self.gu)
        gemv("down", self.gu, w["wd"], self.d, gated=True)
        gemv("qkv", self.d, w["wqkv"], self.qkv)

    def layer_stream(self, i: int, w: dict, variant: str) -> None:
        args = (
            self.qkv[:, :H], self.res[i % 2], w["wo"], w["wgu"], w["wd"], w["wqkv"],
            w["g_post"], w["g_next"], EPS, EPS,
        )  # fmt: skip
        outputs = dict(
            residual_out=self.res[(i + 1) % 2], qkv_out=self.qkv, scratch=(self.o, self.gu, self.d)
        )
        if variant in DYN_CONFIGS:
            block_n, buffers, warps = DYN_CONFIGS[variant]
            layer_stream_dyn(*args, **outputs, block_n=block_n, buffers=buffers, num_warps=warps)
        elif variant in WS_CONFIGS:
            block_n, buffers, warps, registers, wait, compute, interleave = WS_CONFIGS[variant]
            layer_stream_ws(
                *args, **outputs, block_n=block_n, buffers=buffers, num_warps=warps,
                max_registers=registers, wait=wait, compute=compute, interleave=interleave,
            )  # fmt: skip
        else:
            layer_stream(*args, **outputs, config=CONFIGS[variant], pdl=True)

    def step(self, variant: str) -> None:
        for i, w in enumerate(self.layers):
            if variant == "separate":
                self.layer_separate(i, w)
            else:
                self.layer_stream(i, w, variant)


def check(chain: Chain, variant: str) -> dict:
    """One layer both ways from the same inputs: max |diff| / max |separate| of qkv and
    of the residual, and whether three launches in a row agree bit for bit."""
    w = chain.layers[0]
    qkv0, res0 = chain.qkv.clone(), chain.res[0].clone()
    chain.layer_separate(0, w)
    ref_qkv, ref_res = chain.qkv.clone(), chain.res[1].clone()
    outs = []
    for _ in range(3):
        chain.qkv.copy_(qkv0)
        chain.res[0].copy_(res0)
        for t in (chain.o, chain.gu, chain.d, chain.res[1]):
            t.fill_(float("nan"))
        chain.layer_stream(0, w, variant)
        torch.cuda.synchronize()
        outs.append((chain.qkv.clone(), chain.res[1].clone()))

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.float() - b.float()).abs().max() / b.float().abs().max())

    same = all(torch.equal(outs[0][0], q) and torch.equal(outs[0][1], r) for q, r in outs[1:])
    chain.qkv.copy_(qkv0)
    chain.res[0].copy_(res0)
    return {
        "qkv_rel": rel(outs[0][0], ref_qkv),
        "residual_rel": rel(outs[0][1], ref_res),
        "finite": bool(torch.isfinite(outs[0][0]).all() and torch.isfinite(outs[0][1]).all()),
        "repeatable": same,
    }


def capture(step: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """``step`` run once eagerly (compiles, and raises there rather than in a capture),
    then captured in a CUDA graph that has been replayed once."""
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_variant(chain: Chain, variant: str, replays: int) -> float:
    """Microseconds per layer, one rep."""
    graph = capture(lambda: chain.step(variant))
    return replay_seconds(graph, replays) * 1e6 / len(chain.layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--name", default="layer_stream_probe_gpu")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("needs a CUDA GPU of compute capability 9.0 or later (PDL)")
    chain = Chain(args.layers)
    checks = {}
    for v in [*CONFIGS, *WS_CONFIGS, *DYN_CONFIGS]:
        if (v in CONFIGS and CONFIGS[v].wait != 7) or (
            v in WS_CONFIGS and not all(WS_CONFIGS[v][4:6])
        ):
            checks[v] = {"qkv_rel": float("nan"), "repeatable": "timing only"}
            continue
        try:
            checks[v] = check(chain, v)
        except Exception as e:  # a config that does not compile: reported, not timed
            checks[v] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print("checks", checks, flush=True)
    variants = ["separate", *(v for v in checks if "error" not in checks[v])]
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.reps):  # interleaved
        for v in variants:
            times[v].append(time_variant(chain, v, args.replays))
        print({v: round(t[-1], 2) for v, t in times.items()}, flush=True)
    layer_bytes = (H * H + 2 * INTER * H + H * INTER + QKV * H) * 2
    rows = {
        v: {
            "us_per_layer": spread(t),
            "tb_s": layer_bytes / statistics.median(t) / 1e6,
            "check": checks.get(v),
        }
        for v, t in times.items()
    } | {v: {"check": c} for v, c in checks.items() if "error" in c}
    base = statistics.median(times["separate"])
    doc = {
        "benchmark": args.name,
        "environment": environment(),
        "device": torch.cuda.get_device_name(),
        "settings": vars(args) | {"out": str(args.out)},
        "variants": rows,
    }
    lines = [
        "# One persistent launch per decode layer against the separate kernels (batch 1)",
        "",
        f"{args.layers} Qwen3-8B-shaped layers [o, add+norm, gate_up, down gated, add+norm, "
        f"qkv] per CUDA graph, {layer_bytes / 1e6:.1f} MB of weights a layer; median "
        f"(min–max) of {args.reps} reps of {args.replays} replays. {doc['device']}.",
        "",
        "| variant | µs a layer | TB/s | saved a step (36 layers) µs | qkv rel diff | repeatable |",
        "|---|---|---|---|---|---|",
    ]
    for v, r in rows.items():
        c = r["check"] or {}
        if "error" in c:
            lines.append(f"| {v} | {c['error'][:80]} | | | | |")
            continue
        saved = (base - statistics.median(times[v])) * 36
        lines.append(
            f"| {v} | {fmt_spread(r['us_per_layer'])} | {r['tb_s']:.2f} | {saved:.0f} | "
            f"{c.get('qkv_rel', 0):.1e} | {c.get('repeatable', '-')} |"
        )
    write_results(args.out, args.name, doc, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
