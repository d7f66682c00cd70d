"""Decode-sized GEMMs: per weight shape and row count, the faster of cuBLAS and the
skinny kernel (with its fastest launch config), chosen by timing them at start-up.

A decode or verification step multiplies a few rows (M <= 16) by each weight, and its
cost is reading the weight once. cuBLAS does that near the bandwidth for most shapes but
picks poorly for a few small ones, and the skinny kernel's best launch config varies by
shape. On an H200 at one row, each shape on its best config: Qwen3-0.6B's o_proj
2048->1024 takes 12.7 us on cuBLAS against 3.4 us on ``kernels.skinny_gemm``; among the
8B shapes o_proj, down_proj and qkv_proj run at 0.87-0.90x cuBLAS's time, gate_up_proj
at 1.04x. A fixed table would not carry over to other GPUs and library versions, so
:func:`tune_decode_gemms` times cuBLAS and each of ``candidate_configs`` on the model's
own weights: each trial runs every layer's weight of one shape in turn, so the weights
stream from HBM as in a real step rather than sitting in L2. A layer then sends an input
of M rows to the skinny kernel, with the fastest config, only where that was clearly
faster (``Linear.skinny_configs``); the choice depends on M alone, so eager and
graph-replayed steps of one batch size run the same kernels.

With ``pdl`` (``kernels/_pdl.py``) each candidate is also timed launched dependently, and
such a launch is kept where it is at least as fast as cuBLAS (``PDL_MARGIN``).
"""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from jacana_engine.layers.linear import Linear
from jacana_engine.tuning.gpu_timing import replay_seconds

if TYPE_CHECKING:
    from jacana_engine.kernels.skinny_gemm import SkinnyConfig
    from jacana_engine.tuning.cache import TuningCache

log = logging.getLogger(__name__)

MARGIN = 0.9  # the skinny kernel must take at most this fraction of cuBLAS's time
# ... unless launched with PDL: then the kernels around it overlap its launch as well,
# and a cuBLAS launch in their midst would break that chain
PDL_MARGIN = 1.0
SKINNY_MAX_ROWS = 16  # kernels.skinny_gemm.MAX_M, without importing Triton here
_TRIALS = 3


def tune_decode_gemms(
    model: nn.Module,
    rows: Iterable[int],
    *,
    pdl: bool = False,
    cache: TuningCache | None = None,
) -> dict[tuple, dict[int, SkinnyConfig]]:
    """Set ``skinny_configs`` on every CUDA :class:`Linear` of ``model``, trying the row
    counts ``rows`` (those the decode graphs run); returns, per (out, in, dtype) shape,
    the row counts that go to the skinny kernel and the launch config of each. ``pdl``
    adds each candidate launched with programmatic dependent launch
    (``SkinnyConfig.pdl``; timed as the layers run back to back). With a ``cache``
    (``tuning/cache.py``) a shape timed before on this GPU and software is read
    back instead.

    Cost: per shape and row count, 1 + C CUDA graphs (cuBLAS and C candidates: 6-9 at one
    row, three to four times that with ``pdl``; 1-2 above) of one call per layer of that
    shape, each replayed 1 + 3 times; for Qwen3-8B at rows 1-16 that was ~200 graphs,
    ~5 s of start-up on an H200 with Triton's compile cache warm, before the one-row
    lookahead and whole-row candidates (each distinct config compiles once, cached on
    disk after)."""
    rows = list(rows)
    groups: dict[tuple, list[Linear]] = defaultdict(list)
    for module in model.modules():
        if isinstance(module, Linear) and module.weight.device.type == "cuda":
            groups[(*module.weight.shape, module.weight.dtype)].append(module)
    picked = {}
    for shape, layers in groups.items():
        picked[shape] = _tune_shape(layers, rows, pdl, cache)
    return picked


def _tune_shape(
    layers: list[Linear], rows: list[int], pdl: bool = False, cache: TuningCache | None = None
) -> dict[int, SkinnyConfig]:
    """The winners of :func:`_time_shape` (or the cache's memory of them), set on every
    layer as ``skinny_configs`` and returned."""
    kind = "skinny-gated" if _gated(layers) else "skinny"
    picked = _remembered(cache, kind, layers, rows, pdl, lambda: _time_shape(layers, rows, pdl))
    for layer in layers:  # a plain dict each: shares no state, deep-copies and pickles
        layer.skinny_configs = dict(picked)
    return picked


def _gated(layers: list[Linear]) -> bool:
    return all(layer.gated_input for layer in layers)


def _time_shape(layers: list[Linear], rows: list[int], pdl: bool) -> dict[int, SkinnyConfig]:
    """Time cuBLAS and each candidate config on ``layers`` (one weight shape) per row
    count, as the layers run: with ``gated_input``, the activation kernel plus cuBLAS
    against the skinny kernel with the activation folded in (which reads twice the
    input, once per program, so its best tiling differs). The row counts where the
    skinny kernel wins, with the winning config."""
    from jacana_engine.kernels.activation import silu_and_mul
    from jacana_engine.kernels.skinny_gemm import can_use

    weight = layers[0].weight  # [N, K]
    k = weight.shape[1]
    gated = _gated(layers)

    def runs_for(m: int) -> tuple[list[Callable], Callable] | None:
        x = torch.randn(m, 2 * k if gated else k, device=weight.device, dtype=weight.dtype)
        if not can_use(x.new_empty(m, k), weight):  # the rows the kernel multiplies
            return None

        def cublas(layer: Linear) -> Any:
            return layer.backend_forward(silu_and_mul(x) if gated else x)

        def skinny(layer: Linear, cfg: SkinnyConfig) -> Any:
            return layer.skinny_forward(x, cfg, gated=gated)

        return [cublas], skinny

    return _pick_per_row(layers, rows, pdl, runs_for)


def _fastest(
    layers: list[Linear],
    configs: list[SkinnyConfig],
    run: Callable[[Linear, SkinnyConfig], Any],
) -> tuple[float, SkinnyConfig] | None:
    """(seconds, config) of the fastest of ``configs`` for ``run(layer, config)`` on every
    layer; a config that fails to compile or launch on this GPU is skipped (and logged),
    so one bad candidate costs its speed, not the engine's start. None if all fail."""
    timed = []
    for cfg in configs:
        try:
            timed.append((_time(layers, lambda layer, cfg=cfg: run(layer, cfg)), cfg))
        except Exception as exc:  # Triton raises compiler and resource errors of many types
            log.warning("skinny GEMM config %s skipped: %s: %s", cfg, type(exc).__name__, exc)
    return min(timed, key=lambda t: t[0]) if timed else None


def _margin(cfg: SkinnyConfig) -> float:
    return PDL_MARGIN if cfg.pdl else MARGIN


def _pick_per_row(
    layers: list[Linear],
    rows: list[int],
    pdl: bool,
    runs_for: Callable[[int], tuple[list[Callable], Callable] | None],
) -> dict[int, SkinnyConfig]:
    """Per row count m, the launches the layers run now against one skinny launch with
    each candidate config; ``runs_for(m)`` gives (the present runs, each ``run(layer)``;
    the skinny run, ``run(layer, config)``), or None where the kernel cannot take m rows.
    The fastest candidate (the folded kernel's among them) is kept where it takes under
    ``_margin(config)`` times the present runs' time; returns those row counts with their
    config."""
    from jacana_engine.kernels.skinny_gemm import candidate_configs

    weight = layers[0].weight
    n, k = weight.shape
    picked: dict[int, SkinnyConfig] = {}
    report = []
    for m in rows:
        runs = runs_for(m)
        if runs is None:
            continue
        present_runs, skinny = runs
        present = sum(_time(layers, run) for run in present_runs)
        fastest = _fastest(layers, candidate_configs(m, n, k, pdl=pdl, folded=True), skinny)
        if fastest is None:
            continue
        best, cfg = fastest
        if best < _margin(cfg) * present:
            picked[m] = cfg
        per_layer = 1e6 / len(layers)  # seconds per pass -> us per call
        report.append(
            f"M={m} {'skinny' if m in picked else 'cuBLAS'} (skinny {config_label(cfg)} "
            f"{best * per_layer:.2f} us, cuBLAS {present * per_layer:.2f} us)"
        )
    log.info("decode GEMM %dx%d %s: %s", n, k, weight.dtype, "; ".join(report))
    return picked


@torch.inference_mode()
def _time(layers: list[Linear], run: Callable[[Linear], Any]) -> float:
    """Median seconds of ``run`` on every layer in turn (one call each), replayed from a
    CUDA graph as decode steps are (timed eagerly, the launch overhead would decide
    instead)."""
    for layer in layers:  # compiles the kernel outside the capture
        run(layer)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in layers:
            run(layer)
    graph.replay()
    return statistics.median(replay_seconds(graph) for _ in range(_TRIALS))


def _remembered(
    cache: TuningCache | None,
    kind: str,
    layers: list[Linear],
    rows: list[int],
    pdl: bool,
    time_it: Callable[[], dict[int, SkinnyConfig]],
) -> dict[int, SkinnyConfig]:
    """``time_it()``, or what ``cache`` kept of it for these layers' shape on this GPU."""
    if cache is None:
        return time_it()
    key = cache.key(kind, layers[0].weight, rows, pdl=pdl)
    choice = cache.get(key)
    if choice is None:
        choice = time_it()
        cache.put(key, choice)
    else:
        n, k = layers[0].weight.shape
        picks = ", ".join(f"M={m} {config_label(c)}" for m, c in sorted(choice.items())) or "none"
        log.info("%s %dx%d from the tuning cache %s: %s", kind, n, k, cache.path, picks)
    return choice


def describe_decode_gemms(model: nn.Module) -> dict[str, dict[str, dict[int, str]]]:
    """What the tuner chose, per weight shape ("NxK", " gated" for a gated input): the row
    counts that run on the skinny kernel (``skinny``), each with its launch config's
    label; row counts absent from ``skinny`` run on cuBLAS. For benchmark records: the
    choice can differ run to run where candidates time close."""
    described: dict[str, dict[str, dict[int, str]]] = {}
    for module in model.modules():
        if not isinstance(module, Linear):
            continue
        n, k = module.weight.shape
        name = f"{n}x{k}{' gated' if module.gated_input else ''}"
        if name in described:  # every layer of a shape holds the same choice
            continue
        configs = module.skinny_configs
        described[name] = (
            {"skinny": {m: config_label(cfg) for m, cfg in sorted(configs.items())}}
            if configs
            else {}
        )
    return described


def config_label(cfg: SkinnyConfig) -> str:
    """A launch config's name in the tuner's log and records, e.g. ``8x512 pdl+2``,
    ``2x2048 pdl ahead``, ``8x1024 pdl fold8`` (the folded kernel), ``2x4096 pdl fold8
    act`` (activating a gate_up's pairs)."""
    prefetch = f" pdl+{cfg.prefetch_tiles}" if cfg.prefetch_tiles != 1 else " pdl"
    ahead = " ahead" if cfg.lookahead else ""
    fold = f" fold{cfg.k_fold}" if cfg.k_fold > 1 else ""
    act = " act" if cfg.activates else ""
    return f"{cfg.block_n}x{cfg.block_k}{prefetch if cfg.pdl else ''}{ahead}{fold}{act}"
