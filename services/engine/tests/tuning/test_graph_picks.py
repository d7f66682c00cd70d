"""``tuning/graph_picks.py`` on the CPU: the grouping of a model's layers by weight
shape, coordinate descent over a known cost, and the start-up search around it (a graph
time computed from the configs the layers hold stands in for the GPU's clock)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.layers.linear import Linear
from jacana_engine.tuning import graph_picks as picks
from jacana_engine.tuning.cache import TuningCache


def test_layers_group_by_shape_in_forward_order_without_the_excluded():
    qkv, o, down, head = Linear(64, 96), Linear(32, 64), Linear(48, 64), Linear(64, 500)
    down.gated_input = True
    model = torch.nn.Sequential(qkv, o, down, Linear(64, 96), Linear(32, 64), head)
    groups = picks.shape_groups(model, exclude=(head,))
    assert list(groups) == ["96x64", "64x32", "64x48 gated"]
    assert groups["96x64"][0] is qkv and len(groups["96x64"]) == 2
    assert len(groups["64x32"]) == 2 and groups["64x48 gated"] == [down]


def test_only_groups_of_gate_ups_are_offered_activating_launches():
    """``one_row_choices``: a group whose every layer is a gated MLP's gate_up
    (``Linear.gated_output``) also gets the activating candidates; a mixed or plain group
    does not."""
    gate_ups = [Linear(64, 96), Linear(64, 96)]
    for layer in gate_ups:
        layer.gated_output = True
    choices = picks.one_row_choices(
        {"gate_up": gate_ups, "mixed": [gate_ups[0], Linear(64, 96)], "plain": [Linear(64, 96)]},
        pdl=True,
    )
    assert any(c.activates for c in choices["gate_up"][1:])
    assert choices["gate_up"][: len(choices["plain"])] == choices["plain"]
    assert not any(c is not picks.CUBLAS and c.activates for c in choices["mixed"])
    assert choices["mixed"] == choices["plain"]


def test_descent_keeps_each_groups_best_given_the_ones_before():
    # cost: a per-group table, plus an interaction: "b" is cheap only once "a" is 2
    table = {"a": {1: 5.0, 2: 3.0, 3: 4.0}, "b": {1: 2.0, 2: 6.0}}

    def cost(assignment):
        interaction = -3.0 if (assignment["a"], assignment["b"]) == (2, 2) else 0.0
        return table["a"][assignment["a"]] + table["b"][assignment["b"]] + interaction

    calls = []

    def time_of(assignment):
        calls.append(dict(assignment))
        return cost(assignment)

    best, rows = picks.descend({"a": [1, 2, 3], "b": [1, 2]}, {"a": 1, "b": 2}, time_of)
    # a searched with b at its start (2): a=2 wins (3 + 6 - 3 = 6); then b with a=2:
    # b=1 gives 5, b=2 gives 6
    assert best == {"a": 2, "b": 1}
    assert [(r["group"], r["choice"], r["seconds"]) for r in rows] == [
        ("a", 1, 11.0), ("a", 2, 6.0), ("a", 3, 10.0), ("b", 1, 5.0), ("b", 2, 6.0),
    ]  # fmt: skip
    assert calls[3] == {"a": 2, "b": 1}


def test_a_screened_descent_times_only_each_groups_finalists_in_full():
    # the true cost prefers the highest option; the screen is off by a fixed error that
    # ranks the true best second ("a") or fourth ("b") of five
    true = {"a": [5.0, 4.0, 3.0, 2.0, 1.0], "b": [5.0, 4.0, 3.0, 2.0, 1.0]}
    error = {"a": [0.0, 0.0, 0.0, 0.0, 1.5], "b": [0.0, 0.0, 0.0, 0.0, 3.5]}
    full = []

    def time_of(assignment):
        full.append(dict(assignment))
        return sum(true[g][assignment[g]] for g in true)

    def screen_of(assignment):
        return sum(true[g][assignment[g]] + error[g][assignment[g]] for g in true)

    best, rows = picks.descend(
        {"a": list(range(5)), "b": list(range(5))}, {"a": 0, "b": 0}, time_of, screen_of
    )
    # "a": the screen's three fastest are 3, 4, 2, and the full timing crowns 4; "b": the
    # true best (4) screens fourth, out of the finalists, so its best finalist (3) stays
    assert best == {"a": 4, "b": 3}
    assert len(full) == 2 * picks.FINALISTS
    stages = [(r["group"], r["stage"]) for r in rows]
    assert stages.count(("a", "screen")) == 5 and stages.count(("a", "final")) == 3
    assert [r["choice"] for r in rows if r["stage"] == "final" and r["group"] == "a"] == [3, 4, 2]


def test_a_group_of_no_more_than_the_finalists_skips_the_screen():
    screened = []
    best, rows = picks.descend(
        {"a": [1, 2]}, {"a": 1}, lambda a: float(a["a"]), lambda a: screened.append(a) or 0.0
    )
    assert best == {"a": 1} and not screened
    assert {r["stage"] for r in rows} == {"final"}


def _model() -> torch.nn.Sequential:
    """Two layers of each of two shapes, a one-row pick already set on each (the chain's)."""
    from jacana_engine.kernels.skinny_gemm import candidate_configs

    model = torch.nn.Sequential(
        Linear(1024, 96), Linear(2048, 64), Linear(1024, 96), Linear(2048, 64)
    )
    for layer in model:
        n, k = layer.weight.shape
        layer.skinny_configs = {1: candidate_configs(1, n, k)[0], 2: candidate_configs(2, n, k)[0]}
    return model


def _graph_time(model, cost_of) -> callable:
    """A graph time: the sum over the layers of ``cost_of(layer, its one-row choice)``,
    counting its calls."""

    def seconds() -> float:
        seconds.calls += 1
        return sum(cost_of(layer, layer.skinny_configs.get(1)) for layer in model)

    seconds.calls = 0
    return seconds


def _candidates(layer) -> list:
    """The skinny configs the search tries on ``layer`` at one row."""
    return picks.one_row_choices({"g": [layer]}, pdl=False)["g"][1:]


def _last_candidate_wins(layer, cfg) -> float:
    """cuBLAS costs 10, a skinny config 5, the last candidate of the layer's shape 4."""
    if cfg is None:
        return 10.0
    return 4.0 if cfg == _candidates(layer)[-1] else 5.0


def test_the_search_keeps_the_fastest_in_graph_choice_and_other_rows(tmp_path):
    model = _model()
    two_rows = {id(layer): layer.skinny_configs[2] for layer in model}
    seconds = _graph_time(model, _last_candidate_wins)
    cache = TuningCache(tmp_path / "tuning.json")
    best = picks.tune_one_row_in_graph(model, seconds, pdl=False, cache=cache)
    for layer in model:
        assert layer.skinny_configs[1] == _candidates(layer)[-1]
        assert layer.skinny_configs[1] != _candidates(layer)[0]  # not the chain's pick
        assert layer.skinny_configs[2] is two_rows[id(layer)]  # other row counts untouched
    assert set(best) == {"96x1024", "64x2048"}
    calls = seconds.calls
    assert calls == 2 + sum(
        len(c) for c in picks.one_row_choices(picks.shape_groups(model), False).values()
    )
    # a second start on the same cache reads the answer back without timing anything
    again = _model()
    seconds_again = _graph_time(again, _last_candidate_wins)
    assert picks.tune_one_row_in_graph(again, seconds_again, pdl=False, cache=cache) == best
    assert seconds_again.calls == 0
    assert [layer.skinny_configs[1] for layer in again] == [
        layer.skinny_configs[1] for layer in model
    ]


def test_the_start_up_search_screens_every_choice_and_times_three_a_group_in_full():
    model = _model()
    seconds = _graph_time(model, _last_candidate_wins)
    screen = _graph_time(model, _last_candidate_wins)
    picks.tune_one_row_in_graph(model, seconds, pdl=False, screen_seconds=screen)
    choices = picks.one_row_choices(picks.shape_groups(model), False)
    assert screen.calls == sum(len(c) for c in choices.values())
    # the start and the best once each, then the finalists of each group
    assert seconds.calls == 2 + picks.FINALISTS * len(choices)
    assert all(layer.skinny_configs[1] == _candidates(layer)[-1] for layer in model)


def test_cublas_wins_where_it_is_fastest_and_a_failing_choice_is_skipped():
    model = _model()

    def cost(layer, cfg):
        if cfg == _candidates(layer)[-1]:
            raise RuntimeError("out of resources")  # as a launch that cannot run
        return 1.0 if cfg is None else 2.0

    best = picks.tune_one_row_in_graph(model, _graph_time(model, cost), pdl=False)
    assert all(choice is picks.CUBLAS for choice in best.values())
    assert all(1 not in layer.skinny_configs and 2 in layer.skinny_configs for layer in model)


def test_the_chains_picks_stay_when_the_best_times_slower_than_they_did(monkeypatch):
    """Two choices within noise: the descent may crown one that its own second timing
    finds slower than the chain's picks; those then stay."""
    model = _model()
    start = [layer.skinny_configs[1] for layer in model]
    real_search = picks.search_one_row

    def noisy_search(groups, graph_seconds, *, pdl, **screen):
        found = real_search(groups, graph_seconds, pdl=pdl, **screen)
        found.best_seconds = found.start_seconds + 1.0
        return found

    monkeypatch.setattr(picks, "search_one_row", noisy_search)
    best = picks.tune_one_row_in_graph(model, _graph_time(model, _last_candidate_wins), pdl=False)
    assert [layer.skinny_configs[1] for layer in model] == start
    assert list(best.values()) == start[:2]


def test_nothing_changes_when_no_graph_can_be_timed():
    model = _model()
    start = [layer.skinny_configs[1] for layer in model]

    def broken() -> float:
        raise RuntimeError("capture failed")

    picks.tune_one_row_in_graph(model, broken, pdl=False)
    assert [layer.skinny_configs[1] for layer in model] == start


def _cfg(block_n: int, block_k: int = 512):
    from jacana_engine.kernels.skinny_gemm import SkinnyConfig

    return SkinnyConfig(1, block_n, block_k, False, pdl=True)


def test_the_lean_twin_takes_the_fastest_wide_tile_within_the_tolerance():
    narrow, wide, wider, too_slow = _cfg(2), _cfg(8), _cfg(16), _cfg(32)
    rows = [
        {"group": "a", "choice": narrow, "seconds": 1.000, "stage": "final"},
        {"group": "a", "choice": wider, "seconds": 1.020, "stage": "screen"},
        {"group": "a", "choice": wide, "seconds": 1.030, "stage": "screen"},
        {"group": "a", "choice": wide, "seconds": 1.008, "stage": "final"},  # the last counts
        {"group": "a", "choice": picks.CUBLAS, "seconds": 0.900, "stage": "final"},
        {"group": "b", "choice": narrow, "seconds": 1.000, "stage": "final"},
        {"group": "b", "choice": too_slow, "seconds": 1.011, "stage": "final"},
        {"group": "c", "choice": wider, "seconds": 1.000, "stage": "final"},
    ]
    best = {"a": narrow, "b": narrow, "c": wider, "d": picks.CUBLAS}
    lean = picks.lean_assignment(best, rows)
    # a: the wide tile's full timing is within 1%, cuBLAS is no tile; b: nothing wide
    # within 1%; c: already wide; d: cuBLAS stays
    assert lean == {"a": wide, "b": narrow, "c": wider, "d": picks.CUBLAS}
    assert picks.lean_assignment(best, rows, tolerance=0.05)["b"] == too_slow


def test_the_faster_under_sustained_load_wins_and_each_is_timed_in_turn():
    groups = {"a": [Linear(1024, 96)]}
    best, lean = {"a": _cfg(2)}, {"a": _cfg(8)}
    timed = []

    def sustained(lean_seconds: float):
        def seconds() -> float:
            block_n = groups["a"][0].skinny_configs[1].block_n
            timed.append(block_n)
            return lean_seconds if block_n == 8 else 2.0

        return seconds

    assert picks.sustained_choice(groups, best, lean, sustained(1.5)) == lean
    assert timed == [2, 8] * picks.SUSTAINED_ROUNDS
    assert picks.sustained_choice(groups, best, lean, sustained(2.5)) == best
    timed.clear()
    assert picks.sustained_choice(groups, best, dict(best), sustained(1.5)) == best
    assert not timed  # no twin, nothing to time

    def broken() -> float:
        raise RuntimeError("capture failed")

    assert picks.sustained_choice(groups, best, lean, broken) == best


def test_the_search_ends_on_the_lean_twin_when_it_is_faster_under_load():
    """Cold, each shape's narrowest tile wins by a hair; under load every wide tile is
    faster: the layers end on each shape's fastest wide tile."""
    model = _model()

    def cold(layer, cfg) -> float:
        if cfg is None:
            return 10.0
        return 4.0 if cfg.block_n < picks.LEAN_BLOCK_N else 4.01 + cfg.block_n * 1e-4

    def hot(layer, cfg) -> float:
        return 5.0 if cfg is None or cfg.block_n < picks.LEAN_BLOCK_N else 4.5

    sustained = _graph_time(model, hot)
    best = picks.tune_one_row_in_graph(
        model, _graph_time(model, cold), pdl=False, sustained_seconds=sustained
    )
    assert sustained.calls == 2 * picks.SUSTAINED_ROUNDS
    for layer in model:
        wide = [c for c in _candidates(layer) if c.block_n >= picks.LEAN_BLOCK_N]
        assert layer.skinny_configs[1] == min(wide, key=lambda c: c.block_n)
    assert all(c.block_n >= picks.LEAN_BLOCK_N for c in best.values())
