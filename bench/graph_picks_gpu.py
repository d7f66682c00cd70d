"""In-graph search of the one-row decode GEMM picks, on a CUDA GPU.

The tuner (``layers/decode_gemm.py``) times each weight shape's candidate launch configs
as a chain of that shape's GEMVs, one a layer, replayed from a CUDA graph: there each
GEMV follows another GEMV. In a decode step each follows a small kernel (an RMSNorm,
decode attention) or another shape's GEMV, and a dependent launch's early tiles fill
that kernel's latency differently. This tool times what a step takes instead: for each
weight shape in the batch-1 decode graph, in the order the graph runs them, every
one-row candidate (and cuBLAS) is set on all layers of that shape, a batch-1 graph is
captured afresh (with the lm_head and the greedy argmax at its end, as serving captures
it) and replayed over a real context length. Coordinate descent: the best of a shape is
kept while the next shape is searched; the lm_head is the last shape. The engine runs
this search at start-up (``tune_in_graph``,
``layers/graph_picks.py``; its engine here has it off, so the search starts from the
chain's picks); this tool reports every timing of it.

The engine screens every choice with a few replays and times only each shape's three
fastest in full. The tool runs that screened search too, from the same start, and
reports what each search took and picked, and the graph time of each one's picks,
timed alternately (median of three each).

Writes ``graph_picks_gpu.{json,md}``: per shape the tuner's pick, the in-graph best and
every candidate's graph time (median of ``--reps``).

``$FOLDED_PEELS`` (e.g. "1 2") sets the folded kernel's candidate counts of weight tiles
loaded before the wait (``skinny_gemm.FOLDED_PEELS``; the engine's: one), for the chain's
tuning and both searches.

Usage: python bench/graph_picks_gpu.py [--model qwen3-8b] [--context 320] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import RESULTS_DIR, environment, write_results


def one_row_engine(model_name: str, **config: Any):
    """An ``LLMEngine`` on ``model_name``'s config (``bench/configs``) with random bf16
    weights on CUDA, its graphs and decode-GEMM tuning at one row only; ``config`` adds
    ``EngineConfig`` fields."""
    from common import dummy_engine_config

    from jacana_engine.core.engine import LLMEngine

    settings = {"max_num_seqs": 1, **config}
    return LLMEngine(dummy_engine_config(model_name, kv_gib=2, **settings), tokenizer=None)


def search(model_name: str, context: int, reps: int, replays: int) -> dict[str, Any]:
    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.tuning.graph_picks import (
        apply_one_row,
        choice_label,
        search_one_row,
        shape_groups,
    )

    # $FOLDED_PEELS (e.g. "1 2"): the folded candidates' tile counts loaded before the wait
    peels = os.environ.get("FOLDED_PEELS", "").split()
    if peels:
        skinny_gemm.FOLDED_PEELS = tuple(int(p) for p in peels)
    # the searches below start from the chain's picks
    engine = one_row_engine(model_name, tune_in_graph=False)
    model, runner = engine.model, engine.runner
    groups = shape_groups(model)

    def graph_seconds() -> float:
        return runner.one_row_graph_seconds(context, replays, reps)

    started = time.perf_counter()
    screened = search_one_row(
        groups,
        graph_seconds,
        pdl=runner.dependent_launch,
        screen_seconds=lambda: runner.one_row_screen_seconds(context),
    )
    screened_s = time.perf_counter() - started
    apply_one_row(groups, screened.start)
    started = time.perf_counter()
    found = search_one_row(groups, graph_seconds, pdl=runner.dependent_launch)
    full_s = time.perf_counter() - started
    retimed: dict[str, list[float]] = {"screened": [], "full": []}
    for _ in range(3):  # alternately: a drift in the GPU's clocks hits both alike
        for name, picks in (("screened", screened.best), ("full", found.best)):
            apply_one_row(groups, picks)
            retimed[name].append(1e3 * graph_seconds())
    return {
        "search_s": {"screened": screened_s, "full": full_s},
        "graph_ms_retimed": {k: statistics.median(v) for k, v in retimed.items()},
        "best_screened": {g: choice_label(c) for g, c in screened.best.items()},
        "model": model_name,
        "context": context,
        "folded_peels": list(skinny_gemm.FOLDED_PEELS),
        "dependent_launch": runner.dependent_launch,
        "graph_ms_tuned": 1e3 * found.start_seconds,
        "graph_ms_best": 1e3 * found.best_seconds,
        "tuned": {g: choice_label(c) for g, c in found.start.items()},
        "best": {g: choice_label(c) for g, c in found.best.items()},
        "timings": [
            {
                "group": r["group"],
                "choice": choice_label(r["choice"]),
                "graph_ms": 1e3 * r["seconds"],
            }
            for r in found.rows
        ],
    }


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"# In-graph decode GEMM picks: {doc['model']}, batch 1, {doc['context']}-token context",
        "",
        f"Environment: `{doc['environment']}`. Batch-1 decode graph GPU time, median of "
        f"{doc['reps']} x {doc['replays']} replays; each row sets one shape's one-row "
        "config on all its layers, the shapes searched so far at their best. Folded "
        f"candidates with {doc.get('folded_peels', [1])} tiles loaded before the wait.",
        "",
        f"Graph with the tuner's picks: {doc['graph_ms_tuned']:.3f} ms; with the in-graph "
        f"best: {doc['graph_ms_best']:.3f} ms.",
        "",
        "| shape | tuner's pick | in-graph best |",
        "|---|---|---|",
    ]
    lines += [f"| {g} | {doc['tuned'][g]} | {doc['best'][g]} |" for g in doc["tuned"]]
    if "search_s" in doc:
        lines += [
            "",
            "| search | took s | picks | graph ms, retimed alternately |",
            "|---|---|---|---|",
        ]
        for name, picks in (("screened", doc["best_screened"]), ("full", doc["best"])):
            labels = ", ".join(f"{g} {c}" for g, c in picks.items())
            lines.append(
                f"| {name} | {doc['search_s'][name]:.1f} | {labels} | "
                f"{doc['graph_ms_retimed'][name]:.3f} |"
            )
    lines += ["", "| shape | config | graph ms |", "|---|---|---|"]
    lines += [f"| {t['group']} | {t['choice']} | {t['graph_ms']:.3f} |" for t in doc["timings"]]
    return "\n".join(lines)


def run_graph_tool(
    description: str,
    name: str,
    measure: Callable[[str, Any, int, int], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    *,
    contexts: tuple[int, ...] | None = None,
) -> None:
    """The command line of a one-row graph tool: ``--model --context --reps --replays
    --out --name``; ``measure(model, context, reps, replays)`` gives the record,
    ``render`` its table, written as ``NAME.{json,md}`` and printed. With ``contexts``
    the tool takes ``--contexts`` instead (those by default), and ``measure`` their list."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="qwen3-8b")
    if contexts is None:
        parser.add_argument("--context", type=int, default=320, help="KV tokens a replay attends")
    else:
        parser.add_argument("--contexts", type=int, nargs="+", default=list(contexts))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default=name)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    context = args.context if contexts is None else args.contexts
    doc = {
        "environment": environment(),
        "reps": args.reps,
        "replays": args.replays,
        **measure(args.model, context, args.reps, args.replays),
    }
    table = render(doc)
    write_results(args.out, args.name, doc, table)
    print(table)


def main() -> None:
    run_graph_tool(__doc__.splitlines()[0], "graph_picks_gpu", search, render)


if __name__ == "__main__":
    main()
