"""``bench/graph_ablation_gpu.py``'s ablations on the CPU: inside each, a tiny Qwen3's
step runs without the launches it names and with every other one, and every patch is
undone on leaving."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "bench"))
import graph_ablation_gpu as ablation
from tiny_decoder import tiny_qwen3

from jacana_engine.layers.linear import Linear
from jacana_engine.layers.norm import RMSNorm
from jacana_engine.models.registry import build_model
from jacana_engine.tuning.graph_picks import shape_groups


def _tiny_qwen3():
    model = build_model(tiny_qwen3(), device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


@pytest.fixture
def counted(monkeypatch):
    """(model, launches): a tiny Qwen3 whose norms, attention and GEMMs (by weight shape
    label) are counted as they run."""
    model = _tiny_qwen3()
    launches: Counter[str] = Counter()
    backend = model.backend
    for name in ("forward", "add_forward"):  # the decoder's norms (q/k norms are not called)
        real = getattr(RMSNorm, name)
        monkeypatch.setattr(
            RMSNorm, name, lambda *a, real=real, **k: launches.update(["norm"]) or real(*a, **k)
        )
    real_attention = backend.forward
    monkeypatch.setattr(
        backend,
        "forward",
        lambda *a, **k: launches.update(["attention"]) or real_attention(*a, **k),
    )
    real_gemm = Linear.backend_forward

    def gemm(self, x):
        n, k = self.weight.shape
        launches.update([f"{n}x{k}{' gated' if self.gated_input else ''}"])
        return real_gemm(self, x)

    monkeypatch.setattr(Linear, "backend_forward", gemm)
    return model, launches


def _step(model, paged_driver) -> torch.Tensor:
    driver = paged_driver(model, block_size=4, num_blocks=16)
    driver.step([(0, [1, 5, 9, 13])])
    return driver.step([(0, [7])])[0]  # a decode step's logits


def test_each_ablation_leaves_out_what_it_names_and_nothing_else(counted, paged_driver):
    model, launches = counted
    labels = list(shape_groups(model, exclude=(model.lm_head,)))
    assert len(labels) == 4  # qkv, o, gate_up, down (gated)
    _step(model, paged_driver)
    full = Counter(launches)
    assert full["norm"] > 0 and full["attention"] > 0 and all(full[g] > 0 for g in labels)
    names = ablation.ablations(labels)
    assert (next(iter(names)), list(names)[-1]) == ("full graph", "GEMVs alone")
    expect_gone = {
        "without norms": {"norm"},
        "without attention": {"attention"},
        "GEMVs alone": {"norm", "attention"},
        **{f"without {g} GEMVs": {g} for g in labels},
    }
    for name, gone in expect_gone.items():
        launches.clear()
        with names[name]():
            logits = _step(model, paged_driver)
        assert logits.shape[-1] == model.config.vocab_size, name
        left = {kind for kind, count in launches.items() if count > 0}
        assert left == set(full) - gone, name
    launches.clear()  # every patch undone
    _step(model, paged_driver)
    assert launches == full


def test_each_variant_changes_its_setting_and_restores_it():
    import dataclasses

    from jacana_engine.kernels import decode_attention
    from jacana_engine.kernels.skinny_gemm import SkinnyConfig
    from jacana_engine.worker.model_runner import ModelRunner

    model = _tiny_qwen3()
    groups = shape_groups(model, exclude=(model.lm_head,))
    # stand-in one-row picks with the 8B's labels: one launched dependently, one not
    o_layers, qkv_layers = groups["32x64"], groups["128x32"]
    plain = SkinnyConfig(block_m=1, block_n=8, block_k=32, use_dot=False)
    for layer in o_layers:
        layer.skinny_configs = {1: dataclasses.replace(plain, pdl=True)}
    for layer in qkv_layers:
        layer.skinny_configs = {1: plain}
    before = {label: [layer.skinny_configs for layer in g] for label, g in groups.items()}
    splits, block_n, warps = (
        ModelRunner._decode_splits,
        decode_attention._BLOCK_N,
        decode_attention._NUM_WARPS,
    )
    renamed = {"4096x4096": o_layers, "6144x4096": qkv_layers}
    found = ablation.variants(renamed)
    assert "24576x4096 GEMVs prefetching 8 MiB to L2" not in found  # no such group here
    with found["attention in 2 splits"]():
        assert ModelRunner._decode_splits(None, 1) == 2
    with found["attention tiles of 16 tokens"]():
        assert decode_attention._BLOCK_N == 16
    with found["attention in 8 warps"]():
        assert decode_attention._NUM_WARPS == 8
    with found["4096x4096 GEMVs prefetching 16 MiB to L2"]():
        assert all(layer.skinny_configs[1].l2_prefetch_bytes == 16 << 20 for layer in o_layers)
    with found["6144x4096 GEMVs prefetching 8 MiB to L2"]():  # without PDL: left alone
        assert all(layer.skinny_configs[1].l2_prefetch_bytes == 0 for layer in qkv_layers)
    assert (ModelRunner._decode_splits, decode_attention._BLOCK_N, decode_attention._NUM_WARPS) == (
        splits,
        block_n,
        warps,
    )
    assert {label: [layer.skinny_configs for layer in g] for label, g in groups.items()} == before


def test_the_context_sweep_times_each_context_with_and_without_attention():
    from jacana_engine.models.attention import DecoderAttention

    real = DecoderAttention.attend_heads
    calls = []

    class Runner:  # stands in for ModelRunner: one graph replay's seconds per call
        def one_row_graph_seconds(self, context, replays, reps, head=True):
            patched = DecoderAttention.attend_heads is not real
            calls.append((context, patched, head))
            return (4.0 + context / 1e4 - (0.2 if patched else 0.0)) / 1e3

    sweep = ablation.context_sweep(Runner(), (1, 256), reps=3, replays=20)
    assert calls == [(1, False, False), (1, True, False), (256, False, False), (256, True, False)]
    assert DecoderAttention.attend_heads is real  # undone
    assert [row["context"] for row in sweep] == [1, 256]
    assert sweep[1]["graph_ms"] == pytest.approx(4.0256)
    assert sweep[1]["no_attention_ms"] == pytest.approx(3.8256)
    table = ablation.sweep_table(sweep, layers=4)
    # attention: 0.2 ms over 4 layers = 50 µs a layer; growth over the first: 25.5 µs
    assert table[2].startswith("| 1 | 4.000 | 3.800 | 50.00 | +0 |")
    assert table[3] == "| 256 | 4.026 | 3.826 | 50.00 | +26 |"
