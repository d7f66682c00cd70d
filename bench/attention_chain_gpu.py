"""What batch-1 decode attention costs in the decode graph's chain, by context and launch (GPU).

For each context length (KV tokens a replay attends) the 8B's batch-1 decode graph (the
forward alone, no lm_head) is captured and replayed with its attention as the engine
launches it, without its attention (timing only), and with each variant of
``ATTENTION_VARIANTS`` (one split a KV head: no merge, the tiles one after another, at a
few software-pipeline depths; a fixed split count). The attention's cost a layer is the
graph's time over the graph without it, divided by the layers.

This separates what a split's merge costs (the last program's partial stores, arrival
and merge) from what walking a sequence's tiles in one program costs, at the contexts of
the batch-1 benchmark (128-384 tokens) and beyond.

Writes ``attention_chain_gpu.{json,md}``.

Usage: python bench/attention_chain_gpu.py [--model qwen3-8b] [--contexts 1 64 ...] [--out DIR]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from graph_ablation_gpu import with_attention_launch, with_decode_splits, without_attention
from graph_picks_gpu import one_row_engine, run_graph_tool

CONTEXTS = (1, 64, 128, 192, 256, 320, 384, 512, 1024, 2048)


@contextlib.contextmanager
def _both(*changes: Callable[[], Any]):
    with contextlib.ExitStack() as stack:
        for change in changes:
            stack.enter_context(change())
        yield


ATTENTION_VARIANTS: dict[str, Callable[[], Any]] = {
    "engine": contextlib.nullcontext,
    "no attention": without_attention,
    "1 split, 2 stages": lambda: with_decode_splits(1),
    "1 split, 3 stages": lambda: _both(
        lambda: with_decode_splits(1), lambda: with_attention_launch(_NUM_STAGES=3)
    ),
    "1 split, 4 stages": lambda: _both(
        lambda: with_decode_splits(1), lambda: with_attention_launch(_NUM_STAGES=4)
    ),
    "4 splits": lambda: with_decode_splits(4),
}


def measure(model_name: str, contexts: list[int], reps: int, replays: int) -> dict[str, Any]:
    engine = one_row_engine(model_name)
    runner = engine.runner
    rows = []
    for context in contexts:
        row: dict[str, Any] = {"context": context}
        for name, change in ATTENTION_VARIANTS.items():
            with change():
                seconds = runner.one_row_graph_seconds(context, replays, reps, head=False)
            row[name] = 1e3 * seconds
        rows.append(row)
        print(row, flush=True)
    return {
        "model": model_name,
        "layers": engine.model.config.num_hidden_layers,
        "splits_engine": runner._decode_splits(1),
        "rows": rows,
    }


def render(doc: dict[str, Any]) -> str:
    names = [n for n in ATTENTION_VARIANTS if n != "no attention"]
    lines = [
        f"# Batch-1 decode attention in the chain: {doc['model']}",
        "",
        f"Environment: `{doc['environment']}`. The forward's decode graph (no lm_head), "
        f"median of {doc['reps']} x {doc['replays']} replays; the engine's graph splits "
        f"each KV head's context {doc['splits_engine']} ways. Attention µs a layer: the "
        "graph's time over the graph without attention, over the layers.",
        "",
        "| context | graph ms | without attention ms | "
        + " | ".join(f"{n} µs a layer" for n in names)
        + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for row in doc["rows"]:
        base = row["no attention"]
        cells = [f"{1e3 * (row[n] - base) / doc['layers']:.2f}" for n in names]
        lines.append(
            f"| {row['context']} | {row['engine']:.3f} | {base:.3f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    run_graph_tool(
        __doc__.splitlines()[0], "attention_chain_gpu", measure, render, contexts=CONTEXTS
    )


if __name__ == "__main__":
    main()
