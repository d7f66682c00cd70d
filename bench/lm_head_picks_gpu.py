"""The lm_head's one-row picks timed where the lm_head runs: after the decode graph (CUDA GPU).

The lm_head GEMV (with the float32 copy and argmax of greedy sampling) runs after each
batch-1 decode graph replay, outside it. The tuner times its candidate launch configs in
a chain of lm_head GEMVs, where one candidate's dependent launch overlaps the one before
it; after a graph nothing of the kind precedes it. Across H200 machine starts the step
took 4.27 ms with the pick ``4x1024 pdl`` and 4.12-4.18 ms with ``4x1024 pdl+2``, with
decode graphs that differed by less. This tool measures that directly: for cuBLAS and
every one-row candidate of the lm_head, the batch-1 graph replayed over a real context
and followed by the logits and argmax, and the same launches alone.

Writes ``lm_head_picks_gpu.{json,md}``: per choice the step (graph, lm_head, argmax), what
the lm_head and argmax add to the graph there, and what they take alone (median of
``--reps`` runs of ``--replays``).

Usage: python bench/lm_head_picks_gpu.py [--model qwen3-8b] [--context 320] [--out DIR]
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from graph_picks_gpu import one_row_engine, run_graph_tool

log = logging.getLogger(__name__)


def time_choices(
    choices: Sequence[Any],
    apply: Callable[[Any], None],
    step_seconds: Callable[[], float],
    alone_seconds: Callable[[], float],
) -> list[dict[str, Any]]:
    """For each choice: ``apply(choice)``, then the step's and the launches' own seconds
    (a choice that fails to compile or launch gets None for both). The first choice is
    applied again at the end (pass the pick in force first)."""
    rows = []
    for choice in choices:
        apply(choice)
        try:
            step, alone = step_seconds(), alone_seconds()
        except Exception as exc:  # a candidate that fails to compile or launch
            log.warning("lm_head choice skipped: %s: %s", type(exc).__name__, exc)
            step = alone = None
        rows.append({"choice": choice, "step_s": step, "alone_s": alone})
    if choices:
        apply(choices[0])
    return rows


def measure(model_name: str, context: int, reps: int, replays: int) -> dict[str, Any]:
    import torch

    from jacana_engine.gpu_timing import call_seconds
    from jacana_engine.kernels.skinny_gemm import candidate_configs
    from jacana_engine.layers.graph_picks import CUBLAS, apply_one_row, choice_label

    engine = one_row_engine(model_name)
    model, runner = engine.model, engine.runner
    if model.lm_head is None:
        raise SystemExit(f"{model_name} ties its lm_head to the embeddings: nothing to pick")
    graphs = runner.decode_graphs([1])
    graphs.capture()
    hidden = graphs.output(1)  # [1, hidden]
    group = {"lm_head": [model.lm_head]}
    pick = model.lm_head.skinny_configs.get(1, CUBLAS)
    # every candidate, plain launches too: nothing before the lm_head is a chain to keep
    n, k = model.lm_head.weight.shape
    every = [CUBLAS, *candidate_configs(1, n, k, pdl=runner.dependent_launch)]
    others = [c for c in every if c != pick]

    def logits_and_argmax() -> torch.Tensor:  # what a greedy step launches after its graph
        return model.compute_logits(hidden).argmax(dim=-1)

    def step() -> float:
        return graphs.replay_seconds(1, context, replays, reps, after=logits_and_argmax)

    def alone() -> float:
        logits_and_argmax()  # compiled and warm
        return statistics.median(call_seconds(logits_and_argmax, replays) for _ in range(reps))

    graph_s = graphs.replay_seconds(1, context, replays, reps)
    rows = time_choices(
        [pick, *others], lambda c: apply_one_row(group, {"lm_head": c}), step, alone
    )
    return {
        "model": model_name,
        "context": context,
        "dependent_launch": runner.dependent_launch,
        "tuned": choice_label(pick),
        "graph_ms": 1e3 * graph_s,
        "rows": [
            {
                "choice": choice_label(r["choice"]),
                "step_ms": None if r["step_s"] is None else 1e3 * r["step_s"],
                "after_graph_us": None if r["step_s"] is None else 1e6 * (r["step_s"] - graph_s),
                "alone_us": None if r["alone_s"] is None else 1e6 * r["alone_s"],
            }
            for r in rows
        ],
    }


def render(doc: dict[str, Any]) -> str:
    def cell(value: float | None, digits: int) -> str:
        return "failed" if value is None else f"{value:.{digits}f}"

    lines = [
        f"# The lm_head's one-row picks after the decode graph: {doc['model']}, batch 1, "
        f"{doc['context']}-token context",
        "",
        f"Environment: `{doc['environment']}`. Median of {doc['reps']} x {doc['replays']} "
        f"replays. The graph alone: {doc['graph_ms']:.3f} ms. The tuner's pick: "
        f"{doc['tuned']} (first row).",
        "",
        "| lm_head choice | step ms (graph, logits, argmax) | after the graph µs | alone µs |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['choice']} | {cell(r['step_ms'], 3)} | {cell(r['after_graph_us'], 1)} | "
        f"{cell(r['alone_us'], 1)} |"
        for r in doc["rows"]
    ]
    return "\n".join(lines)


def main() -> None:
    run_graph_tool(__doc__.splitlines()[0], "lm_head_picks_gpu", measure, render)


if __name__ == "__main__":
    main()
