"""In-graph search of the one-row decode GEMM picks, on a CUDA GPU.

The tuner (``layers/decode_gemm.py``) times each weight shape's candidate launch configs
as a chain of that shape's GEMVs, one a layer, replayed from a CUDA graph: there each
GEMV follows another GEMV. In a decode step each follows a small kernel (an RMSNorm,
decode attention) or another shape's GEMV, and a dependent launch's early tiles fill
that kernel's latency differently. This tool times what a step takes instead: for each
weight shape in the batch-1 decode graph, in the order the graph runs them, every
one-row candidate (and cuBLAS) is set on all layers of that shape, a batch-1 graph is
captured afresh and replayed over a real context length. Coordinate descent: the best
of a shape is kept while the next shape is searched. The lm_head runs after the graph
and is left as tuned.

Writes ``graph_picks_gpu.{json,md}``: per shape the tuner's pick, the in-graph best and
every candidate's graph time (median of ``--reps``).

Usage: python bench/graph_picks_gpu.py [--model qwen3-8b] [--context 320] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from common import RESULTS_DIR, environment, replay_ms, write_results

CUBLAS = None  # the choice "no skinny config at one row": the layer runs on cuBLAS


def shape_groups(model: torch.nn.Module, exclude: tuple[torch.nn.Module, ...] = ()):
    """The model's ``Linear`` layers grouped by weight shape (and gated input), in the
    order the forward meets them: {label: [layers]}, labels as ``describe_decode_gemms``
    writes them. ``exclude``: layers left out (the lm_head, outside the graph)."""
    from jacana_engine.layers.linear import Linear

    groups: dict[str, list[Linear]] = {}
    for module in model.modules():
        if isinstance(module, Linear) and not any(module is e for e in exclude):
            n, k = module.weight.shape
            groups.setdefault(f"{n}x{k}{' gated' if module.gated_input else ''}", []).append(module)
    return groups


def descend(
    choices: Mapping[str, list[Any]],
    start: Mapping[str, Any],
    time_of: Callable[[dict[str, Any]], float],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Coordinate descent: for each group in ``choices``' order, time every choice with
    the other groups at their current best (``start`` at first) and keep the fastest.
    Returns (the best assignment, one row per timing: group, choice, seconds)."""
    best = dict(start)
    rows = []
    for group, options in choices.items():
        timed = []
        for option in options:
            seconds = time_of({**best, group: option})
            timed.append((seconds, option))
            rows.append({"group": group, "choice": option, "seconds": seconds})
        best[group] = min(timed, key=lambda t: t[0])[1]
    return best, rows


def _label(choice) -> str:
    from jacana_engine.layers.decode_gemm import config_label

    return "cuBLAS" if choice is CUBLAS else config_label(choice)


def _apply(groups: Mapping[str, list], assignment: Mapping[str, Any]) -> None:
    for group, layers in groups.items():
        choice = assignment[group]
        for layer in layers:
            configs = {m: c for m, c in layer.skinny_configs.items() if m != 1}
            if choice is not CUBLAS:
                configs[1] = choice
            layer.skinny_configs = configs


def _graph_seconds(runner, context: int, reps: int, replays: int) -> float:
    """Median over ``reps`` of one batch-1 decode graph replay's GPU time, the graph
    captured afresh (it keeps the launch configs it saw)."""
    graphs = runner.decode_graphs([1])
    graphs.capture()
    graph = graphs.timing_graph(1, context)
    for _ in range(3):
        graph.replay()
    times = [replay_ms(graph, replays) / 1e3 for _ in range(reps)]
    del graph, graphs
    torch.cuda.empty_cache()
    return statistics.median(times)


def search(model_name: str, context: int, reps: int, replays: int) -> dict[str, Any]:
    from offline_gpu import config_dir

    from jacana_engine.config import EngineConfig
    from jacana_engine.engine import LLMEngine
    from jacana_engine.kernels.skinny_gemm import candidate_configs

    engine = LLMEngine(
        EngineConfig(
            model=str(config_dir(model_name) / "config.json"),
            load_format="dummy",
            dtype="bfloat16",
            device="cuda",
            kv_cache_memory_bytes=2 << 30,
            max_model_len=2048,
            max_num_seqs=1,  # graphs and tuning at one row only
            seed=1,
        ),
        tokenizer=None,
    )
    model, runner = engine.model, engine.runner
    groups = shape_groups(model, exclude=tuple(m for m in (model.lm_head,) if m is not None))
    tuned = {g: layers[0].skinny_configs.get(1, CUBLAS) for g, layers in groups.items()}
    choices = {}
    for group, layers in groups.items():
        n, k = layers[0].weight.shape
        options = [c for c in candidate_configs(1, n, k, pdl=runner.dependent_launch) if c.pdl]
        choices[group] = [CUBLAS, *(options or candidate_configs(1, n, k))]

    def time_of(assignment: dict[str, Any]) -> float:
        _apply(groups, assignment)
        try:
            return _graph_seconds(runner, context, reps, replays)
        except Exception as exc:  # a candidate that fails to compile or launch here
            print(f"skipped {assignment}: {type(exc).__name__}: {exc}")
            return float("inf")

    tuned_seconds = time_of(tuned)
    best, rows = descend(choices, tuned, time_of)
    best_seconds = time_of(best)
    return {
        "model": model_name,
        "context": context,
        "dependent_launch": runner.dependent_launch,
        "graph_ms_tuned": 1e3 * tuned_seconds,
        "graph_ms_best": 1e3 * best_seconds,
        "tuned": {g: _label(c) for g, c in tuned.items()},
        "best": {g: _label(c) for g, c in best.items()},
        "timings": [
            {"group": r["group"], "choice": _label(r["choice"]), "graph_ms": 1e3 * r["seconds"]}
            for r in rows
        ],
    }


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"# In-graph decode GEMM picks: {doc['model']}, batch 1, {doc['context']}-token context",
        "",
        f"Environment: `{doc['environment']}`. Batch-1 decode graph GPU time, median of "
        f"{doc['reps']} x {doc['replays']} replays; each row sets one shape's one-row "
        "config on all its layers, the shapes searched so far at their best.",
        "",
        f"Graph with the tuner's picks: {doc['graph_ms_tuned']:.3f} ms; with the in-graph "
        f"best: {doc['graph_ms_best']:.3f} ms.",
        "",
        "| shape | tuner's pick | in-graph best |",
        "|---|---|---|",
    ]
    lines += [f"| {g} | {doc['tuned'][g]} | {doc['best'][g]} |" for g in doc["tuned"]]
    lines += ["", "| shape | config | graph ms |", "|---|---|---|"]
    lines += [f"| {t['group']} | {t['choice']} | {t['graph_ms']:.3f} |" for t in doc["timings"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--context", type=int, default=320, help="KV tokens a replay attends")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default="graph_picks_gpu")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    doc = {
        "environment": environment(),
        "reps": args.reps,
        "replays": args.replays,
        **search(args.model, args.context, args.reps, args.replays),
    }
    table = render(doc)
    write_results(args.out, args.name, doc, table)
    print(table)


if __name__ == "__main__":
    main()
