"""Where a batch-1 decode step's time goes, by leaving kernels out of the graph (CUDA GPU).

A profiler cannot split a decode graph launched with programmatic dependent launch: each
kernel's span includes its wait for the one before, so a 2 µs RMSNorm shows 13 µs. This
tool measures what each kind of kernel costs *in the chain* instead: it captures the
batch-1 decode graph afresh with one kind of launch replaced by nothing (its output an
uninitialized buffer of the right shape: timing only, the values are garbage) and
reports how much faster the graph replays. Kinds: the RMSNorms (with their residual
adds), decode attention (with its folded RoPE and KV store), each weight shape's GEMVs,
and every launch but the GEMVs (what the layers' GEMVs take back to back).

Then the same graph with one launch setting changed (variants, real results): decode
attention with another split count, tile or warp count, and one weight shape's GEMVs
asking L2 to prefetch part of their weight while the kernel before them runs.

Last, the whole graph and the graph without its attention at a few context lengths
(``CONTEXT_SWEEP``): what the attention costs as the context grows from one token to the
benchmark's 128-384 (a b1 TPOT run's contexts), apart from the rest of the graph.

Writes ``graph_ablation_gpu.{json,md}``: per ablation or variant the graph time, its
saving over the whole graph (negative: slower), per step and per layer; and the context
sweep.

Usage: python bench/graph_ablation_gpu.py [--model qwen3-8b] [--context 320] [--out DIR]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from graph_picks_gpu import one_row_engine, run_graph_tool


@contextlib.contextmanager
def _patched(owner: type, name: str, replacement: Callable) -> Iterator[None]:
    """``owner.name`` replaced by ``replacement`` while the block runs."""
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def without_norms() -> Iterator[None]:
    """Every decoder RMSNorm (and its residual add) launches nothing: the rows pass
    through, the residual stays as it was."""
    from jacana_engine.layers.norm import RMSNorm

    def then(self, linear, x, residual):
        return linear(x), x if residual is None else residual

    def between(self, producer, x, residual, consumer, *, gated=False):
        y = producer.gated_forward(x, self.ops.silu_and_mul) if gated else producer(x)
        return (y if consumer is None else consumer(y)), residual

    with (
        _patched(RMSNorm, "forward", lambda self, x: x),
        _patched(RMSNorm, "then", then),
        _patched(RMSNorm, "between", between),
    ):
        yield


@contextlib.contextmanager
def without_attention() -> Iterator[None]:
    """Decode attention (with whatever RoPE and KV store the backend folds into it)
    launches nothing: o_proj reads an uninitialized buffer."""
    from jacana_engine.models.attention import DecoderAttention

    def attend_heads(self, qkv, rope_tables, kv_cache, meta):
        return qkv.new_empty(qkv.shape[0], self.n_heads * self.head_dim)

    with _patched(DecoderAttention, "attend_heads", attend_heads):
        yield


@contextlib.contextmanager
def without_gemvs(label: str | None = None) -> Iterator[None]:
    """The GEMVs of one weight shape (``graph_picks.shape_groups`` labels; every shape
    when None) launch nothing: their outputs are uninitialized buffers."""
    from jacana_engine.layers.linear import Linear

    def skipped(layer: Linear) -> bool:
        n, k = layer.weight.shape
        name = f"{n}x{k}{' gated' if layer.gated_input else ''}"
        return label is None or name == label

    forward, gated_forward = Linear.forward, Linear.gated_forward

    def plain(self, x):
        if skipped(self):
            return x.new_empty(x.shape[0], self.out_features)
        return forward(self, x)

    def gated(self, gate_up, silu_and_mul):
        if skipped(self):
            return gate_up.new_empty(gate_up.shape[0], self.out_features)
        return gated_forward(self, gate_up, silu_and_mul)

    with _patched(Linear, "forward", plain), _patched(Linear, "gated_forward", gated):
        yield


@contextlib.contextmanager
def only_gemvs() -> Iterator[None]:
    """Nothing but the GEMVs launches (no norm, no attention)."""
    with without_norms(), without_attention():
        yield


@contextlib.contextmanager
def with_decode_splits(splits: int) -> Iterator[None]:
    """Batch-1 decode attention in ``splits`` split-K programs per KV head (instead of
    the runner's ``choose_num_splits``)."""
    from jacana_engine.worker.model_runner import ModelRunner

    with _patched(ModelRunner, "_decode_splits", lambda self, padded_batch: splits):
        yield


@contextlib.contextmanager
def with_attention_launch(**constants: int) -> Iterator[None]:
    """Decode attention launched with other module constants of
    ``kernels.decode_attention`` (``_BLOCK_N``: KV tokens a tile; ``_NUM_WARPS``)."""
    from jacana_engine.kernels import decode_attention

    saved = {name: getattr(decode_attention, name) for name in constants}
    for name, value in constants.items():
        setattr(decode_attention, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(decode_attention, name, value)


@contextlib.contextmanager
def with_l2_prefetch(layers: list, nbytes: int) -> Iterator[None]:
    """The one-row dependent-launch picks of ``layers`` (one weight shape) ask L2 for
    ``nbytes`` of their weight a launch before they wait (``SkinnyConfig``)."""
    import dataclasses

    saved = [layer.skinny_configs for layer in layers]
    for layer in layers:
        cfg = layer.skinny_configs.get(1)
        if cfg is not None and cfg.pdl:
            one_row = dataclasses.replace(cfg, l2_prefetch_bytes=nbytes)
            layer.skinny_configs = {**layer.skinny_configs, 1: one_row}
    try:
        yield
    finally:
        for layer, configs in zip(layers, saved, strict=True):
            layer.skinny_configs = configs


def variants(groups: dict[str, list]) -> dict[str, Callable[[], Any]]:
    """Each launch-setting variant's name and context manager factory."""
    found: dict[str, Callable[[], Any]] = {}
    for splits in (1, 2, 4, 8, 32):
        found[f"attention in {splits} splits"] = lambda s=splits: with_decode_splits(s)
    for tokens in (16, 32):
        found[f"attention tiles of {tokens} tokens"] = lambda t=tokens: with_attention_launch(
            _BLOCK_N=t
        )
    for warps in (2, 8):
        found[f"attention in {warps} warps"] = lambda w=warps: with_attention_launch(_NUM_WARPS=w)
    mib = 1 << 20
    for label, sizes in (("4096x4096", (8, 16, 32)), ("6144x4096", (8,)), ("24576x4096", (8,))):
        for size in sizes:
            if label in groups:
                found[f"{label} GEMVs prefetching {size} MiB to L2"] = (
                    lambda g=groups[label], n=size * mib: with_l2_prefetch(g, n)
                )
    return found


def ablations(shape_labels: list[str]) -> dict[str, Callable[[], Any]]:
    """Each ablation's name and its context manager factory, the full graph first."""
    found: dict[str, Callable[[], Any]] = {
        "full graph": contextlib.nullcontext,
        "without norms": without_norms,
        "without attention": without_attention,
    }
    for label in shape_labels:
        found[f"without {label} GEMVs"] = lambda label=label: without_gemvs(label)
    found["GEMVs alone"] = only_gemvs
    return found


CONTEXT_SWEEP = (1, 128, 256, 384, 2048)  # KV tokens a replay attends (capped by the model)


def context_sweep(runner, contexts, reps: int, replays: int) -> list[dict[str, Any]]:
    """Per context: the whole graph's and the graph without attention's ms."""
    rows = []
    for context in contexts:
        row = {"context": context}
        for key, change in (
            ("graph_ms", contextlib.nullcontext),
            ("no_attention_ms", without_attention),
        ):
            with change():
                row[key] = 1e3 * runner.one_row_graph_seconds(context, replays, reps, head=False)
        rows.append(row)
    return rows


def sweep_table(sweep: list[dict[str, Any]], layers: int) -> list[str]:
    """The context sweep as Markdown rows: each context's graph, the graph without its
    attention, the attention's share a layer, and the graph's growth over the first."""
    lines = [
        "| context tokens | graph ms | without attention ms | attention µs a layer "
        "| graph vs first µs |",
        "|---|---|---|---|---|",
    ]
    first = sweep[0]["graph_ms"] if sweep else 0.0
    for row in sweep:
        attention = 1e3 * (row["graph_ms"] - row["no_attention_ms"]) / layers
        growth = 1e3 * (row["graph_ms"] - first)
        lines.append(
            f"| {row['context']} | {row['graph_ms']:.3f} | {row['no_attention_ms']:.3f} | "
            f"{attention:.2f} | {growth:+.0f} |"
        )
    return lines


def measure(model_name: str, context: int, reps: int, replays: int) -> dict[str, Any]:
    from jacana_engine.tuning.graph_picks import shape_groups

    engine = one_row_engine(model_name)
    model, runner = engine.model, engine.runner
    groups = shape_groups(model, exclude=(model.lm_head,))
    layers = model.config.num_hidden_layers
    rows = []
    kinds = [("ablation", ablations(list(groups))), ("variant", variants(groups))]
    for kind, found in kinds:
        for name, change in found.items():
            with change():
                # the forward alone: its GEMV rate is the layers' (lm_head left out)
                seconds = runner.one_row_graph_seconds(context, replays, reps, head=False)
            rows.append({"ablation": name, "kind": kind, "graph_ms": 1e3 * seconds})
    full = rows[0]["graph_ms"]
    for row in rows:
        row["saved_ms"] = full - row["graph_ms"]
        row["saved_us_per_layer"] = 1e3 * row["saved_ms"] / layers
    weight_bytes = sum(
        layer.weight.numel() * layer.weight.element_size() for g in groups.values() for layer in g
    )
    return {
        "model": model_name,
        "context": context,
        "layers": layers,
        "decode_gemm_weight_gb": weight_bytes / 1e9,
        "dependent_launch": runner.dependent_launch,
        "rows": rows,
        "context_sweep": context_sweep(runner, CONTEXT_SWEEP, reps, replays),
    }


def render(doc: dict[str, Any]) -> str:
    gemvs = next(r for r in doc["rows"] if r["ablation"] == "GEMVs alone")
    rate = doc["decode_gemm_weight_gb"] / gemvs["graph_ms"]  # GB/ms = TB/s
    lines = [
        f"# Where a batch-1 decode graph's time goes: {doc['model']}, "
        f"{doc['context']}-token context",
        "",
        f"Environment: `{doc['environment']}`. Each row captures the graph afresh with one "
        "kind of launch left out or one setting changed; median of "
        f"{doc['reps']} x {doc['replays']} replays. "
        f"The layers' GEMVs alone stream {doc['decode_gemm_weight_gb']:.2f} GB at "
        f"{rate:.2f} TB/s.",
        "",
        "Kind: an ablation leaves launches out (timing only, its values are garbage); a "
        "variant is a real setting.",
        "",
        "| graph | kind | ms | saved ms | saved µs a layer |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['ablation']} | {r.get('kind', 'ablation')} | {r['graph_ms']:.3f} | "
        f"{r['saved_ms']:.3f} | {r['saved_us_per_layer']:.2f} |"
        for r in doc["rows"]
    ]
    if doc.get("context_sweep"):
        lines += ["", "The whole graph and the graph without its attention by context:", ""]
        lines += sweep_table(doc["context_sweep"], doc["layers"])
    return "\n".join(lines)


def main() -> None:
    run_graph_tool(__doc__.splitlines()[0], "graph_ablation_gpu", measure, render)


if __name__ == "__main__":
    main()
