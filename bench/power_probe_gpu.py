"""Energy and sustained pace of a batch-1 decode layer chain, by how its GEMVs are launched.

On the H200s lent so far a Qwen3-8B batch-1 decode reaches the card's 700 W power cap
about half a second into a request; the SM clock then falls from 1,980 MHz to
1,480-1,900 and each step takes 3-19% longer (``offline_b1_band_v17_band.md``). A
GEMV streams its weight at a pace set by HBM, but the energy it spends on the way (the
products in float32, x read again by every program, the tiles' trips through registers)
is the SMs', and at the cap that energy is time.

This replays ``layer_stream_probe_gpu.Chain``'s ``separate`` chain (36 Qwen3-8B layers:
four skinny GEMVs and two norms each, PDL) in one CUDA graph back to back for a few
seconds per variant, after an idle pause that lets the card's power average fall, and
reads NVML (``nvml.py``) beside it: the pace of the first ``--cold`` seconds (before the
cap) and of the last ``--hot`` seconds, the energy a replay takes, the mean SM clock and
how often the software power cap was active. Variants: the skinny kernel's launch
configs (the in-graph picks, a few tile shapes, its ``tl.dot`` path with the row padded
to 16, the folded one-row kernel's picks and wider folded tiles, gate_up activating as it
stores with the down projection then reading its input plain (``SkinnyConfig.activates``),
and the weight loads through L1 (``weight_cache=""``) against the default past it),
cuBLAS,
``gemv_mma.py`` (the weight as the tensor cores' wide operand: first each shape alone
over its ``mma_configs``, then the chain on each shape's fastest, and the picks with
only gate_up, or gate_up and qkv, moved to it), the picks with no norm launches
(``Chain.layer_deferred``: the residual added in the o and down GEMVs' epilogues, the
norms deferred into gate_up and qkv, checked against the separate norms on one layer
first; ``Chain.layer_prefolded``: the same with the norms' weights folded into gate_up's
and qkv's, so only 1/rms is left to them), and a memory-only reference (copies moving
about the same bytes).

``--split-ablation`` times the split norms with one part of torch's order left out
(timing only): the producers on contiguous columns, or the consumers summing with
``tl.sum``.

Usage: python bench/power_probe_gpu.py [--out DIR] [--layers 36] [--reps 2] [--seconds 3]
    [--only "VARIANT;VARIANT"] [--no-mma] [--split-ablation contiguous-producers]
Writes ``power_probe_gpu.json`` / ``.md``. Needs an sm90 GPU (PDL) and libnvidia-ml.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl
from common import RESULTS_DIR, environment, fmt_spread, spread, write_results
from gemv_mma import MmaConfig, gemv_mma
from layer_stream_probe_gpu import INTER, PICKS, QKV, Chain, Gemv, H, capture, skinny_gemv
from nvml import SW_POWER_CAP, Nvml

from jacana_engine.kernels import skinny_gemm
from jacana_engine.kernels.activation import silu_and_mul
from jacana_engine.kernels.skinny_gemm import SkinnyConfig, pick_config
from jacana_engine.tuning.gpu_timing import replay_seconds

DEFERRED = "picks, norms deferred into the GEMVs"  # Chain.layer_deferred
SHAPES = {"o": (H, H), "gate_up": (2 * INTER, H), "down": (H, INTER), "qkv": (QKV, H)}  # (N, K)


def _one_row(block_n: int, block_k: int, k_fold: int = 1, peel: int = 1) -> SkinnyConfig:
    """A dependent one-row launch loading ``peel`` weight tiles before its wait;
    ``k_fold`` > 1 runs the folded kernel."""
    return SkinnyConfig(1, block_n, block_k, False, pdl=True, k_fold=k_fold, prefetch_tiles=peel)


def _everywhere(
    block_n: int, block_k: int, k_fold: int = 1, peel: int = 1
) -> dict[str, SkinnyConfig]:
    return {name: _one_row(block_n, block_k, k_fold, peel) for name in SHAPES}


# the sustained search's lean twin on capped cards (seventeenth run): qkv and gate_up
# 8x512 with two tiles loaded before the wait, o and down as picked
LEAN = PICKS | {
    name: SkinnyConfig(1, 8, 512, False, pdl=True, prefetch_tiles=2) for name in ("qkv", "gate_up")
}
# the engine's in-graph picks of the twenty-fifth run: LEAN but qkv with one tile before
# the wait
ENGINE = LEAN | {"qkv": SkinnyConfig(1, 8, 512, False, pdl=True)}
# variants with no norm launches, on wider tiles than the picks' 2-row ones (whose x and
# norm weight reads double the L2 traffic): (layer method, launch configs)
NORMLESS_VARIANTS = {
    "8x1024, norms deferred": ("deferred", _everywhere(8, 1024)),
    "16x512, norms deferred": ("deferred", _everywhere(16, 512)),
    "lean, norms deferred": ("deferred", LEAN),
    "8x1024, norms split": ("split", _everywhere(8, 1024)),
    "lean, norms split": ("split", LEAN),
    "engine, norms split": ("split", ENGINE),
    "lean, no norms (timing only)": ("none", LEAN),
    "8x1024, no norms (timing only)": ("none", _everywhere(8, 1024)),
}


# the folded one-row kernel's picks (k_fold): the twenty-eighth run's start-up search took
# 2x2048 folded at qkv, o and gate_up and kept the gated down's 8x1024 plain; on the
# twenty-ninth run's capped card it took gate_up 1x4096 folded and o 8x1024 plain. Narrow
# tiles read x again for every row or two (8 KB a program from L2): the question is what
# that costs at the cap, and whether wider folded tiles win back pace there.
FOLD = skinny_gemm.FOLD
FOLDED_PICKS = PICKS | {name: _one_row(2, 2048, FOLD) for name in ("o", "gate_up", "qkv")}
FOLDED_NARROW = PICKS | {"qkv": _one_row(2, 2048, FOLD), "gate_up": _one_row(1, 4096, FOLD)}
# the same with two weight tiles loaded before each wait where a row holds more than one
# (the start-up's folded candidates load one): qkv's 2x2048 then loads whole rows
FOLDED_NARROW_PEEL2 = FOLDED_NARROW | {
    "qkv": _one_row(2, 2048, FOLD, peel=2),
    "o": _one_row(8, 1024, peel=2),
    "down": _one_row(8, 1024, peel=2),
}
# the engine's one-row picks of the last runs (FOLDED_NARROW) with no norm launches: the
# norms' weights folded into gate_up's and qkv's (Chain.layer_prefolded), and the same
# launches with nothing between them (timing only: the most any norm fusion could give)
NORMLESS_VARIANTS |= {
    "folded narrow, norms in the weights": ("prefolded", FOLDED_NARROW),
    "folded narrow, no norms (timing only)": ("none", FOLDED_NARROW),
    # its two halves apart (timing only): where the no-norm layer's time goes
    "folded narrow, residual epilogues alone (timing only)": ("residual-only", FOLDED_NARROW),
    "folded narrow, 1/rms in gate_up and qkv alone (timing only)": ("rms-only", FOLDED_NARROW),
}
# gate_up's launch activating its pairs (``SkinnyConfig.activates``): the down projection
# after it reads I activated columns, plain, instead of computing SiLU-and-mul in every
# one of its programs; the same tile not activating beside each, for the tile's own share
_ACTIVATING = {
    f"folded narrow, gate_up {bn}x{bk}{' activating' if act else ''}": FOLDED_NARROW
    | {"gate_up": dataclasses.replace(_one_row(bn, bk, FOLD), activates=act)}
    for bn, bk in ((2, 4096), (2, 2048), (4, 2048), (4, 1024))
    for act in (False, True)
}


def _through_l1(picks: dict[str, SkinnyConfig]) -> dict[str, SkinnyConfig]:
    """``picks`` with every weight load through L1 (``weight_cache=""``), as before the
    default became ``.cg`` (cached in L2 only: the weight streams past L1, and x, which
    each program of an SM reads again, stays there)."""
    return {name: dataclasses.replace(cfg, weight_cache="") for name, cfg in picks.items()}


_THROUGH_L1 = {
    f"{name}, weights through L1": _through_l1(picks)
    for name, picks in [
        ("folded narrow", FOLDED_NARROW),
        *(
            (n, _ACTIVATING[n])
            for n in (f"folded narrow, gate_up {t} activating" for t in ("2x4096", "4x2048"))
        ),
    ]
}
SKINNY_VARIANTS = {
    "picks": PICKS,
    "lean": LEAN,
    "engine": ENGINE,
    "8x1024": _everywhere(8, 1024),
    "16x512": _everywhere(16, 512),
    "32x256": _everywhere(32, 256),
    "folded picks": FOLDED_PICKS,
    "folded narrow": FOLDED_NARROW,
    "folded narrow, peel 2": FOLDED_NARROW_PEEL2,
    "folded narrow, o folded peel 2": FOLDED_NARROW_PEEL2 | {"o": _one_row(2, 2048, FOLD, peel=2)},
    "folded 2x2048 peel 2": _everywhere(2, 2048, FOLD, peel=2),
    "folded 8x1024": _everywhere(8, 1024, FOLD),
    "folded 16x1024": _everywhere(16, 1024, FOLD),
    "folded 8x2048": _everywhere(8, 2048, FOLD),
    **_ACTIVATING,
    **_THROUGH_L1,
    "folded narrow, gate_up 2x4096 activating, down folded 4x2048": _ACTIVATING[
        "folded narrow, gate_up 2x4096 activating"
    ]
    | {"down": _one_row(4, 2048, FOLD)},
    "dot 16-row pad": {
        name: dataclasses.replace(pick_config(1, n, k, use_dot=True), pdl=True)
        for name, (n, k) in SHAPES.items()
    },
}
# K shares a row block in gemv_mma's sweep: 4096 output rows in 64-row tiles are 64
# programs, too few to keep HBM busy (o and down lost to the skinny kernel without them)
SPLITS = {"o": (1, 2, 4), "down": (1, 2, 4, 8), "gate_up": (1,), "qkv": (1, 2)}


def mma_configs(name: str) -> list[MmaConfig]:
    """gemv_mma's sweep for shape ``name``: rows a program x K a step, pipeline stages, K
    shares; the first tile always before the wait (the sweep without it, and 16-row or
    64-wide K tiles, never won: power_probe_gpu_v17.json)."""
    return [
        MmaConfig(block_r, block_k, num_stages=stages, pdl=True, peel=True, split_k=split)
        for block_r in (32, 64, 128)
        for block_k in (128, 256)
        for stages in (3, 5)
        for split in SPLITS[name]
    ]


def _contiguous_producers() -> None:
    """Split-norm producers take columns pid * BLOCK_N on, not torch's threads' columns."""
    skinny_gemm._row_order_args = lambda order: dict(ROW_ORDER=0, ORDER_WIDTH=1)


@triton.jit
def _plain_sum_from(row_ptr, n, LANES: tl.constexpr):
    lanes = tl.arange(0, LANES)
    return tl.sum(tl.load(row_ptr + lanes, mask=lanes < n, other=0.0), axis=0)


def _plain_consumer_sums() -> None:
    """Split-norm consumers add the statistics in Triton's order (before any compile: the
    kernel reads the module's global when it compiles)."""
    skinny_gemm.halved_sum_from = _plain_sum_from


# --split-ablation: what each part of the split norm's torch order costs (timing only)
SPLIT_ABLATIONS = {
    "": lambda: None,
    "contiguous-producers": _contiguous_producers,
    "plain-consumer-sums": _plain_consumer_sums,
}


def cublas_gemv(name: str, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, gated=False):
    return torch.matmul(silu_and_mul(x) if gated else x, weight.t(), out=out)


def mma_gemv(picks: dict[str, MmaConfig], others: Gemv | None = None) -> Gemv:
    """gemv_mma for the shapes in ``picks``, ``others`` for the rest."""

    def gemv(name: str, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, gated=False):
        if name not in picks:
            return others(name, x, weight, out, gated=gated)
        return gemv_mma(x, weight, out, config=picks[name], gated=gated)

    return gemv


class Layers(Chain):
    """The probe's chain, its GEMVs launched per variant, and a memory-only reference."""

    def __init__(self, layers: int) -> None:
        super().__init__(layers)
        for t in (self.normed, self.gu, self.o, self.d):  # inputs of the shapes' sweeps
            t.normal_()
        bf = dict(device="cuda", dtype=torch.bfloat16)
        # the copies' destinations: two [INTER, H] slabs (HBM, not L2)
        self.sinks = (torch.empty(INTER, H, **bf), torch.empty(H, INTER, **bf))
        self.gemvs: dict[str, tuple[Gemv, bool]] = {  # variant: (gemv, norms with PDL)
            name: (skinny_gemv(picks), True) for name, picks in SKINNY_VARIANTS.items()
        } | {"cublas": (cublas_gemv, False)}

    def layer_copy(self, w: dict) -> None:
        # 2 x 100.7 MB read and written: 403 MB of HBM traffic against the GEMVs' 386 MB read
        self.sinks[0].copy_(w["wgu"][:INTER])
        self.sinks[1].copy_(w["wd"])

    def step_variant(self, variant: str) -> None:
        for i, w in enumerate(self.layers):
            if variant == "copy":
                self.layer_copy(w)
            elif variant == DEFERRED:
                self.layer_deferred(w)
            elif variant in NORMLESS_VARIANTS:
                how, picks = NORMLESS_VARIANTS[variant]
                if how == "deferred":
                    self.layer_deferred(w, picks)
                elif how in ("prefolded", "residual-only", "rms-only"):
                    halves = {"residual": how != "rms-only", "deferred": how != "residual-only"}
                    self.layer_prefolded(w, picks, **halves)
                elif how == "split":
                    self.layer_split(w, picks)
                else:
                    self.layer_without_norms(w, skinny_gemv(picks))
            else:
                self.layer_separate(i, w, *self.gemvs[variant])

    def shape_args(self, name: str) -> tuple[torch.Tensor, torch.Tensor, str, bool]:
        """(x, out, the weight's key in a layer, gated) of shape ``name``'s GEMV."""
        return {
            "o": (self.qkv[:, :H], self.o, "wo", False),
            "gate_up": (self.normed, self.gu, "wgu", False),
            "down": (self.gu, self.d, "wd", True),
            "qkv": (self.normed, self.qkv, "wqkv", False),
        }[name]

    def time_shape(self, name: str, gemv: Gemv) -> float | None:
        """µs a call of shape ``name``'s GEMV, once per layer's weight (all from HBM) in
        one graph; None where it does not compile or run (past the shared memory)."""
        x, out, key, gated = self.shape_args(name)

        def calls() -> None:
            for w in self.layers:
                gemv(name, x, w[key], out, gated=gated)

        try:
            graph = capture(calls)
        except Exception:
            return None
        return replay_seconds(graph, 10) * 1e6 / len(self.layers)

    def versus_separate(self, layer: Callable[[dict], None]) -> dict[str, float]:
        """One layer from the same inputs with separate norms and by ``layer`` (a layer
        with no norm launches, its residual in place in ``res[0]``): max |diff| / max
        |separate| of the qkv output and of the residual after the layer."""
        w, qkv0, res0 = self.layers[0], self.qkv.clone(), self.res[0].clone()
        self.layer_separate(0, w)
        ref = self.qkv.clone(), self.res[1].clone()
        self.qkv.copy_(qkv0)
        self.res[0].copy_(res0)
        layer(w)
        got = self.qkv.clone(), self.res[0].clone()
        self.qkv.copy_(qkv0)
        self.res[0].copy_(res0)
        rel = [
            float((g.float() - r.float()).abs().max() / r.float().abs().max())
            for g, r in zip(got, ref, strict=True)
        ]
        return {"qkv_rel_diff": rel[0], "residual_rel_diff": rel[1]}

    def normless_checks(self, variants: list[str]) -> dict[str, dict[str, float]]:
        """``versus_separate`` for each of ``variants`` with no norm launches that computes
        the layer (not the timing-only ones)."""
        methods = {
            "deferred": self.layer_deferred,
            "split": self.layer_split,
            "prefolded": self.layer_prefolded,
        }
        checks = {}
        if DEFERRED in variants:
            checks[DEFERRED] = self.versus_separate(self.layer_deferred)
        for variant, (how, picks) in NORMLESS_VARIANTS.items():
            if how in methods and variant in variants:
                checks[variant] = self.versus_separate(lambda w, m=methods[how], p=picks: m(w, p))
        return checks

    def compare(self, name: str, picks: dict[str, MmaConfig]) -> dict[str, float]:
        """max |mma - skinny| / max |skinny| of shape ``name`` on the first layer's weight."""
        x, out, key, gated = self.shape_args(name)
        ref = skinny_gemv(PICKS)(name, x, self.layers[0][key], out.clone(), gated=gated)
        got = mma_gemv(picks)(name, x, self.layers[0][key], out.clone(), gated=gated)
        err = (got.float() - ref.float()).abs().max() / ref.float().abs().max()
        return {"rel_diff_vs_skinny": float(err)}

    def sweep_mma(self) -> dict[str, dict]:
        """Every ``mma_configs`` entry on every shape beside the skinny picks and cuBLAS
        (µs a call); each shape's fastest gemv_mma config makes the "mma" variant."""
        report, best, won = {}, {}, {}
        for name in SHAPES:
            configs = {cfg.label(): cfg for cfg in mma_configs(name)}
            times = {
                label: self.time_shape(name, mma_gemv({name: c})) for label, c in configs.items()
            }
            fastest = min((t, label) for label, t in times.items() if t is not None)
            best[name] = configs[fastest[1]]
            times["skinny picks"] = self.time_shape(name, skinny_gemv(PICKS))
            times["cublas"] = self.time_shape(name, cublas_gemv)
            if fastest[0] < times["skinny picks"]:
                won[name] = best[name]
            report[name] = {"us": times, "best": best[name].label()} | self.compare(name, best)
            print(name, report[name]["best"], report[name]["rel_diff_vs_skinny"], flush=True)
            ranked = sorted((t, k) for k, t in times.items() if t is not None)
            print({k: round(t, 2) for t, k in ranked})
        self.gemvs["mma"] = (mma_gemv(best), True)
        for shapes in (("gate_up",), ("gate_up", "qkv")):  # the rest on the skinny picks
            label = "picks, " + " + ".join(shapes) + " on mma"
            self.gemvs[label] = (mma_gemv({s: best[s] for s in shapes}, skinny_gemv(PICKS)), True)
        if won:  # each shape on whichever of the two was faster alone
            label = "picks, " + " + ".join(won) + " on mma (faster alone)"
            self.gemvs[label] = (mma_gemv(won, skinny_gemv(PICKS)), True)
        return report


@dataclasses.dataclass
class Batch:
    """One batch of back-to-back replays: when it ended (s from the run's start), its
    replays, its GPU seconds, the card's energy counter after it (mJ), SM clock, reasons."""

    t: float
    replays: int
    gpu_s: float
    energy_mj: int
    sm_mhz: int
    reasons: int


def sustain(graph: torch.cuda.CUDAGraph, nvml: Nvml, seconds: float, replays: int) -> list[Batch]:
    """Replay ``graph`` in batches of ``replays`` for ``seconds``, reading NVML after each."""
    batches = [Batch(0.0, 0, 0.0, nvml.energy_mj(), nvml.sm_mhz(), nvml.event_reasons())]
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        gpu_s = replay_seconds(graph, replays) * replays
        reading = (nvml.energy_mj(), nvml.sm_mhz(), nvml.event_reasons())
        batches.append(Batch(time.perf_counter() - t0, replays, gpu_s, *reading))
    return batches


def summarize(batches: list[Batch], cold_s: float, hot_s: float) -> dict[str, float]:
    """The pace of the first ``cold_s`` and the last ``hot_s`` seconds; the hot window's
    energy a replay, power, mean SM clock and share of batches under the power cap."""
    end = batches[-1].t
    cold = [b for b in batches[1:] if b.t <= cold_s]
    hot_from = next(i for i, b in enumerate(batches) if b.t >= end - hot_s)
    hot = batches[hot_from + 1 :]
    replays = sum(b.replays for b in hot)
    joules = (batches[-1].energy_mj - batches[hot_from].energy_mj) / 1e3
    return {
        "cold_ms": 1e3 * sum(b.gpu_s for b in cold) / max(1, sum(b.replays for b in cold)),
        "hot_ms": 1e3 * sum(b.gpu_s for b in hot) / replays,
        "hot_w": joules / (end - batches[hot_from].t),
        "hot_j_per_replay": joules / replays,
        "hot_sm_mhz": statistics.fmean(b.sm_mhz for b in hot),
        "hot_power_capped": sum(bool(b.reasons & SW_POWER_CAP) for b in hot) / len(hot),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="replaying, per variant")
    parser.add_argument("--idle", type=float, default=1.5, help="pause before each variant")
    parser.add_argument("--cold", type=float, default=0.25)
    parser.add_argument("--hot", type=float, default=1.5)
    parser.add_argument("--name", default="power_probe_gpu")
    parser.add_argument("--no-mma", action="store_true", help="skip gemv_mma's sweep")
    parser.add_argument("--only", default="", help="variants to run, separated by ';'")
    parser.add_argument(
        "--split-ablation",
        choices=sorted(SPLIT_ABLATIONS),
        default="",
        help="timing only (wrong sums): the split norms' producers on contiguous columns, "
        "or their consumers adding the statistics with tl.sum instead of torch's halving",
    )
    args = parser.parse_args()
    SPLIT_ABLATIONS[args.split_ablation]()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("needs a CUDA GPU of compute capability 9.0 or later (PDL)")
    nvml = Nvml(torch.cuda.current_device())
    chain = Layers(args.layers)
    sweep = {} if args.no_mma else chain.sweep_mma()
    variants = [*chain.gemvs, DEFERRED, *NORMLESS_VARIANTS, "copy"]
    if args.only:
        variants = [v for v in variants if v in args.only.split(";")]
    prefolded = ("prefolded", "rms-only")
    if any(NORMLESS_VARIANTS.get(v, ("",))[0] in prefolded for v in variants):
        chain.fold_norm_weights()
    deferred_check = chain.normless_checks(variants)
    print("no norm launches against the separate norms:", deferred_check)
    graphs = {v: capture(lambda v=v: chain.step_variant(v)) for v in variants}
    if not any("timing only" in v for v in variants):  # those may overflow, as they like
        assert torch.isfinite(chain.qkv).all(), "the chain's output is not finite"
    per_batch = max(1, round(0.05 / replay_seconds(graphs[variants[0]])))  # batches of ~50 ms
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for rep in range(args.reps):  # interleaved, each variant from an idle card
        for v in variants:
            time.sleep(args.idle)
            idle_w = nvml.power_w()
            batches = sustain(graphs[v], nvml, args.seconds, per_batch)
            runs[v].append(summarize(batches, args.cold, args.hot) | {"idle_w": idle_w})
            print(rep, v, {k: round(x, 3) for k, x in runs[v][-1].items()}, flush=True)
    layer_bytes = sum(n * k for n, k in SHAPES.values()) * 2
    rows = {
        v: {key: spread([r[key] for r in rs]) for key in rs[0]}
        | {"hot_tb_s": layer_bytes * args.layers / statistics.median(r["hot_ms"] for r in rs) / 1e9}
        for v, rs in runs.items()
    }
    doc = {
        "benchmark": args.name,
        "environment": environment(),
        "device": torch.cuda.get_device_name(),
        "settings": vars(args) | {"out": str(args.out), "replays_per_batch": per_batch},
        "variants": rows,
        "runs": runs,
        "mma_sweep_us": sweep,
        "normless_vs_separate": deferred_check,
    }
    lines = [
        "# Energy and sustained pace of a batch-1 decode layer chain, by GEMV launch",
        "",
        f"{args.layers} Qwen3-8B-shaped layers [o, add+norm, gate_up, down gated, add+norm, "
        f"qkv] in one CUDA graph ({layer_bytes * args.layers / 1e9:.2f} GB of weights), "
        f"replayed back to back for {args.seconds} s after {args.idle} s idle; cold: the "
        f"first {args.cold} s, hot: the last {args.hot} s. Median (min–max) of {args.reps} "
        f"reps. {doc['device']}. `copy` moves about the same HBM bytes (403 MB a layer, "
        "read + written) as a memory-only reference.",
        "",
        "| variant | cold ms | hot ms | hot TB/s | hot W | J a replay | hot SM MHz | "
        "power-capped share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, r in rows.items():
        lines.append(
            f"| {v} | {fmt_spread(r['cold_ms'], 3)} | {fmt_spread(r['hot_ms'], 3)} | "
            f"{r['hot_tb_s']:.2f} | {fmt_spread(r['hot_w'], 0)} | "
            f"{fmt_spread(r['hot_j_per_replay'], 3)} | {fmt_spread(r['hot_sm_mhz'], 0)} | "
            f"{fmt_spread(r['hot_power_capped'], 2)} |"
        )
    write_results(args.out, args.name, doc, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
