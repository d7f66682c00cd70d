"""The decode-GEMM tuner (``tuning/decode_gemm.py``) and the ``Linear`` routing it sets
up: rows tuned onto the skinny kernel run there with their config, the rest on the
backend; the tuner times as the layers run, skips a failing candidate, keeps its picks
in a cache. The clock is fake: kernels run for real, small, under the interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from skinny_cases import TOL

from jacana_engine.kernels.skinny_gemm import (
    MAX_M,
    SkinnyConfig,
    candidate_configs,
    pick_config,
)


@pytest.mark.parametrize("tied", [False, True])
def test_logits_run_on_the_untied_heads_tuned_pick(device, seed, checks, tied, monkeypatch):
    """compute_logits goes through an untied lm_head as a Linear, so the tuner's one-row
    pick for it is what runs (it used to call the backend with the weight, so the pick
    was timed and never used); a tied head has no Linear and keeps the backend."""
    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.models.base import ModelConfig
    from jacana_engine.models.registry import build_model

    cfg = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=40, hidden_size=32, intermediate_size=48,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=64,
        tie_word_embeddings=tied,
    )  # fmt: skip
    model = build_model(cfg, device=device, dtype=torch.float32).requires_grad_(False)
    for param in model.parameters():
        param.copy_(torch.randn_like(param))
    if not tied:
        model.lm_head.skinny_configs = {1: pick_config(1, 40, 32)}
    calls = []
    real = skinny_gemm.skinny_linear
    monkeypatch.setattr(
        skinny_gemm, "skinny_linear", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw)
    )
    weight = model.model.embed_tokens.weight if tied else model.lm_head.weight
    for m in (1, 2):
        hidden = torch.randn(m, 32, device=device)
        got = model.compute_logits(hidden)
        assert got.dtype == torch.float32
        expected = torch.nn.functional.linear(hidden, weight)
        checks.close(got, expected, rel_l2=1e-5, max_rel=1e-4, seed=seed, what=f"m={m}")
    assert calls == ([] if tied else [1])  # one row on the pick, two on the backend


@pytest.mark.parametrize("tuned", [False, True])
def test_gated_forward_folds_the_activation_only_into_skinny_rows(
    device, seed, checks, tuned, monkeypatch
):
    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.layers.linear import Linear

    layer = Linear(48, 40, bias=True).to(device).requires_grad_(False)
    if tuned:
        layer.skinny_configs = {1: pick_config(1, 40, 48)}
    gated_calls, activations = [], []
    real = skinny_gemm.skinny_linear
    monkeypatch.setattr(
        skinny_gemm,
        "skinny_linear",
        lambda *a, **kw: gated_calls.append(kw.get("gated")) or real(*a, **kw),
    )

    def counted_silu_and_mul(x):
        activations.append(x.shape[0])
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    for m in (1, 2):
        gate_up = torch.randn(m, 96, device=device)
        gate, up = gate_up.chunk(2, dim=-1)
        expected = torch.nn.functional.linear(
            torch.nn.functional.silu(gate) * up, layer.weight, layer.bias
        )
        got = layer.gated_forward(gate_up, counted_silu_and_mul)
        checks.close(got, expected, rel_l2=1e-5, max_rel=1e-4, seed=seed, what=f"m={m}")
    # one row on the kernel with the activation folded in; two rows activate, then cuBLAS
    assert (gated_calls, activations) == (([True], [2]) if tuned else ([], [1, 2]))


@pytest.mark.parametrize("bias", [False, True])
def test_linear_sends_only_its_skinny_rows_to_the_kernel(device, seed, checks, bias, monkeypatch):
    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.layers.linear import Linear

    layer = Linear(48, 40, bias=bias).to(device).requires_grad_(False)
    configs = {1: candidate_configs(1, 40, 48)[-1], 3: pick_config(3, 40, 48)}
    layer.skinny_configs = configs
    assert set(layer.skinny_configs) == {1, 3}
    calls = []
    real = skinny_gemm.skinny_linear
    monkeypatch.setattr(
        skinny_gemm, "skinny_linear", lambda *a, **kw: calls.append(kw["config"]) or real(*a, **kw)
    )
    for m in (1, 2, 3):
        x = torch.randn(m, 48, device=device)
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        rel_l2, max_rel = TOL[torch.float32]
        checks.close(layer(x), expected, rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=f"m={m}")
    assert calls == [configs[1], configs[3]]  # rows 1 and 3 with their configs, not 2


class _FakeClock:
    """Stands in for ``decode_gemm._time``: runs the timed call once on the first layer
    (for real, small), notes what it launched, and returns ``price(event)`` for it, an
    event being ("cublas", rows, width), ("skinny", rows, config) or ("gated", rows,
    config)."""

    def __init__(self, monkeypatch, price) -> None:
        from jacana_engine.kernels import skinny_gemm
        from jacana_engine.layers.linear import Linear

        self.price, self.events = price, []
        real_skinny, real_backend = skinny_gemm.skinny_linear, Linear.backend_forward

        def skinny(x, w, *a, **kw):
            kind = "gated" if kw.get("gated") else "skinny"
            self.events.append((kind, x.shape[0], kw["config"]))
            return real_skinny(x, w, *a, **kw)

        def backend(layer, x):
            self.events.append(("cublas", x.shape[0], x.shape[1]))
            return real_backend(layer, x)

        monkeypatch.setattr(skinny_gemm, "skinny_linear", skinny)
        monkeypatch.setattr(Linear, "backend_forward", backend)

    def __call__(self, layers, run) -> float:
        self.events.clear()
        run(layers[0])
        (event,) = self.events
        return self.price(event)


def test_tuner_stores_the_fastest_config_that_forward_uses(device, seed, checks, monkeypatch):
    """The plumbing, with a fake clock: at one row the last candidate is fastest and beats
    cuBLAS, at two rows every candidate loses to cuBLAS by less than the margin."""
    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning import decode_gemm

    k, n = 1100, 72
    fastest = candidate_configs(1, n, k)[-1]

    def price(event):
        if event[0] == "cublas":
            return 1.0
        return 0.95 if event[1] == 2 else 0.5 if event[2] == fastest else 0.8

    monkeypatch.setattr(decode_gemm, "_time", _FakeClock(monkeypatch, price))
    layers = [Linear(k, n, bias=True).to(device).requires_grad_(False) for _ in range(2)]
    assert decode_gemm._tune_shape(layers, [1, 2]) == {1: fastest}
    calls = []
    real = skinny_gemm.skinny_linear
    monkeypatch.setattr(
        skinny_gemm, "skinny_linear", lambda *a, **kw: calls.append(kw["config"]) or real(*a, **kw)
    )
    for layer in layers:
        assert dict(layer.skinny_configs) == {1: fastest}
        for m in (1, 2):
            x = torch.randn(m, k, device=device)
            expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
            rel_l2, max_rel = TOL[torch.float32]
            checks.close(
                layer(x), expected, rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=f"m={m}"
            )
    assert calls == [fastest, fastest]  # one-row calls only, with the tuned config


def test_the_tuner_times_a_gated_layer_as_it_runs(device, seed, checks, monkeypatch):
    """A gated MLP's down projection is timed with the activation folded into the skinny
    kernel (a [M, 2K] input) against the activation kernel followed by cuBLAS (a [M, K]
    input), and ``gated_forward`` then runs the winner."""
    from jacana_engine.kernels.activation import silu_and_mul
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning import decode_gemm

    k, n = 96, 40
    events = []

    def price(event):
        events.append(event)
        return 1.0 if event[0] == "cublas" else 0.5

    monkeypatch.setattr(decode_gemm, "_time", _FakeClock(monkeypatch, price))
    layers = [Linear(k, n, bias=False).to(device).requires_grad_(False) for _ in range(2)]
    for layer in layers:
        layer.gated_input = True
    picked = decode_gemm._tune_shape(layers, [1, 2])
    assert set(picked) == {1, 2}
    assert {e[0] for e in events} == {"cublas", "gated"}
    assert {e[2] for e in events if e[0] == "cublas"} == {k}
    gate_up = torch.randn(2, 2 * k, device=device)
    expected = torch.nn.functional.linear(silu_and_mul(gate_up), layers[0].weight)
    rel_l2, max_rel = TOL[torch.float32]
    checks.close(
        layers[0].gated_forward(gate_up, silu_and_mul),
        expected,
        rel_l2=rel_l2,
        max_rel=max_rel,
        seed=seed,
        what="gated",
    )


def test_a_candidate_that_fails_costs_only_its_own_chance(device, monkeypatch, caplog):
    """Fake clock: a config that raises (a compiler or resource error on some GPU) is
    skipped and the fastest of the others kept; when every one fails, cuBLAS stays."""
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning import decode_gemm

    k, n = 64, 40
    broken, *others = candidate_configs(1, n, k)
    fastest = others[-1]

    def price(event):
        if event[0] == "cublas":
            return 1.0
        if event[2] == broken:
            raise RuntimeError("out of resources")
        return 0.5 if event[2] == fastest else 0.8

    def every_candidate_fails(event):
        if event[0] == "cublas":
            return 1.0
        raise RuntimeError("out of resources")

    for prices, want in ((price, {1: fastest}), (every_candidate_fails, {})):
        monkeypatch.setattr(decode_gemm, "_time", _FakeClock(monkeypatch, prices))
        layers = [Linear(k, n, bias=False).to(device).requires_grad_(False) for _ in range(2)]
        assert decode_gemm._tune_shape(layers, [1]) == want
    assert "skipped: RuntimeError: out of resources" in caplog.text


def test_a_tuning_cache_spares_the_second_start_its_timing(device, monkeypatch, tmp_path):
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning import decode_gemm
    from jacana_engine.tuning.cache import TuningCache

    k, n = 64, 40
    fastest = candidate_configs(1, n, k)[-1]

    def price(event):  # one row: the last candidate wins; two rows: cuBLAS stays
        if event[0] == "cublas":
            return 1.0
        return 0.5 if event[1] == 1 and event[2] == fastest else 0.95

    clock = _FakeClock(monkeypatch, price)
    timings = []
    monkeypatch.setattr(decode_gemm, "_time", lambda *a: timings.append(1) or clock(*a))
    per_start = []
    for _ in range(2):  # the first start times and writes, the second one only reads
        layers = [Linear(k, n, bias=False).to(device).requires_grad_(False) for _ in range(2)]
        cache = TuningCache(tmp_path / "tuning.json")
        assert decode_gemm._tune_shape(layers, [1, 2], cache=cache) == {1: fastest}
        assert all(dict(layer.skinny_configs) == {1: fastest} for layer in layers)
        per_start.append(len(timings))
        timings.clear()
    assert per_start[0] > 0 and per_start[1] == 0


@pytest.mark.gpu
def test_tune_decode_gemms_keeps_the_outputs(gpu, device, seed, checks):
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning.decode_gemm import tune_decode_gemms

    model = torch.nn.Sequential(
        *[Linear(2048, 1024, bias=False) for _ in range(8)],
        *[Linear(1024, 6144, bias=True) for _ in range(2)],
    ).to(device, torch.bfloat16)
    model.requires_grad_(False)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=2048**-0.5)
    chosen = tune_decode_gemms(model, rows=range(1, 5))
    assert set(chosen) == {(1024, 2048, torch.bfloat16), (6144, 1024, torch.bfloat16)}
    for layer in model:
        out, k = layer.weight.shape
        assert dict(layer.skinny_configs) == chosen[(out, k, torch.bfloat16)]
        for m, cfg in layer.skinny_configs.items():
            assert cfg in candidate_configs(m, out, k), (m, cfg)
        for m in range(1, 5):
            x = torch.randn(m, layer.in_features, device=device, dtype=torch.bfloat16)
            expected = torch.nn.functional.linear(x.float(), layer.weight.float(), None)
            if layer.bias is not None:
                expected += layer.bias.float()
            rel_l2, max_rel = TOL[torch.bfloat16]
            checks.close(
                layer(x).float(), expected, rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=f"{m}"
            )


def test_the_tuners_picks_are_described_per_shape():
    from jacana_engine.layers.linear import Linear
    from jacana_engine.tuning.decode_gemm import describe_decode_gemms

    model = torch.nn.Sequential(Linear(64, 40), Linear(64, 40), Linear(32, 64), Linear(32, 64))
    tuned = SkinnyConfig(1, 8, 64, False, pdl=True, prefetch_tiles=2)
    for layer in model[:2]:
        layer.skinny_configs = {1: tuned, 2: SkinnyConfig(2, 8, 64, False)}
    model[2].gated_input = model[3].gated_input = True
    assert describe_decode_gemms(model) == {
        "40x64": {"skinny": {1: "8x64 pdl+2", 2: "8x64"}},
        "64x32 gated": {},
    }


def test_decode_gemm_row_bound_is_the_kernels():
    from jacana_engine.tuning.decode_gemm import SKINNY_MAX_ROWS

    assert SKINNY_MAX_ROWS == MAX_M
