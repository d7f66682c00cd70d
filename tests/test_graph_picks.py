"""``bench/graph_picks_gpu.py``'s search logic on the CPU: the grouping of a model's
layers by weight shape, and coordinate descent over a known cost."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import graph_picks_gpu as picks


def test_layers_group_by_shape_in_forward_order_without_the_excluded():
    from jacana_engine.layers.linear import Linear

    qkv, o, down, head = Linear(64, 96), Linear(32, 64), Linear(48, 64), Linear(64, 500)
    down.gated_input = True
    model = torch.nn.Sequential(qkv, o, down, Linear(64, 96), Linear(32, 64), head)
    groups = picks.shape_groups(model, exclude=(head,))
    assert list(groups) == ["96x64", "64x32", "64x48 gated"]
    assert groups["96x64"][0] is qkv and len(groups["96x64"]) == 2
    assert len(groups["64x32"]) == 2 and groups["64x48 gated"] == [down]


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
