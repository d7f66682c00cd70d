"""Decode-sized GEMMs: per weight shape and row count, the faster of cuBLAS and the
skinny kernel, chosen by timing both at start-up.

A decode or verification step multiplies a few rows (M <= 16) by each weight, and its
cost is reading the weight once. cuBLAS does that near the bandwidth for most shapes but
picks poorly for a few small ones (on an H200, Qwen3-0.6B's o_proj 2048->1024 at one row
takes 12.6 us against 5.7 us for ``kernels.skinny_gemm``; for every 8B shape cuBLAS is as
fast or faster, ``bench/results/skinny_gemm_gpu.md``). A fixed shape table would not
carry over to other GPUs and library versions, so :func:`tune_decode_gemms` times both on
the model's own weights: each trial runs every layer's weight of one shape in turn, so
the weights stream from HBM as in a real step rather than sitting in L2. A layer then
sends an input of M rows to the skinny kernel only where that was clearly faster
(``Linear.skinny_rows``); the choice depends on M alone, so eager and graph-replayed
steps of one batch size run the same kernels.
"""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from collections.abc import Iterable

import torch
from torch import nn

from jacana_engine.layers.linear import Linear

log = logging.getLogger(__name__)

MARGIN = 0.9  # the skinny kernel must take at most this fraction of cuBLAS's time
SKINNY_MAX_ROWS = 16  # kernels.skinny_gemm.MAX_M, without importing Triton here
_TRIALS = 3


def tune_decode_gemms(model: nn.Module, rows: Iterable[int]) -> dict[tuple, list[int]]:
    """Set ``skinny_rows`` on every CUDA :class:`Linear` of ``model``, trying the row
    counts ``rows`` (those the decode graphs run); returns, per (out, in, dtype) shape,
    the row counts that go to the skinny kernel."""
    from jacana_engine.kernels.skinny_gemm import can_use

    rows = list(rows)
    groups: dict[tuple, list[Linear]] = defaultdict(list)
    for module in model.modules():
        if isinstance(module, Linear) and module.weight.device.type == "cuda":
            groups[(*module.weight.shape, module.weight.dtype)].append(module)
    chosen: dict[tuple, list[int]] = {}
    for shape, layers in groups.items():
        weight = layers[0].weight
        picked = []
        for m in rows:
            x = torch.randn(m, weight.shape[1], device=weight.device, dtype=weight.dtype)
            if not can_use(x, weight):
                continue
            cublas = _time(layers, x, skinny=False)
            skinny = _time(layers, x, skinny=True)
            if skinny < MARGIN * cublas:
                picked.append(m)
        for layer in layers:
            layer.skinny_rows = frozenset(picked)
        chosen[shape] = picked
    log.info("decode GEMMs on the skinny kernel (out, in, dtype: rows): %s", chosen)
    return chosen


@torch.inference_mode()
def _time(layers: list[Linear], x: torch.Tensor, skinny: bool) -> float:
    """Median seconds of one pass of ``x`` through every layer, replayed from a CUDA graph
    as decode steps are (timed eagerly, the launch overhead would decide instead)."""
    run = Linear.skinny_forward if skinny else Linear.backend_forward
    for layer in layers:  # compiles the kernel outside the capture
        run(layer, x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in layers:
            run(layer, x)
    graph.replay()
    times = []
    for _ in range(_TRIALS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)
