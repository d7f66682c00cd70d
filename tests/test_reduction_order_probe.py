"""The reduction-order probe (``bench/reduction_order_probe_gpu.py``) on the CPU: the
order it reads off a reducer, summed again on fresh rows, gives that reducer's bits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
probe = pytest.importorskip("reduction_order_probe_gpu")

N = 48


def _times_inverse(total: torch.Tensor) -> torch.Tensor:
    return total * torch.tensor(1.0 / N)


def _torch_order(threads: int, per_load: int, pattern: str):
    return lambda t: probe.emulated_mean(t, threads, per_load, pattern, True)


# (reducer: [R, N] -> means, how its sum becomes the mean)
REDUCERS = {
    "torch's GPU order, 16 threads": (_torch_order(16, 4, "vector"), _times_inverse),
    "strided loads, 4 threads": (_torch_order(4, 2, "strided"), _times_inverse),
    "torch's CPU mean": (lambda t: t.mean(-1), lambda total: total / N),
}


def _fresh_rows() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    # magnitudes spread over 2^-8..2^8, so that another order rounds otherwise
    scale = torch.exp2(torch.randint(-8, 9, (512, N), generator=gen).float())
    return torch.randn(512, N, generator=gen) * scale


@pytest.mark.parametrize("name", list(REDUCERS))
def test_revealed_order_reproduces_the_reducer(name):
    mean, finish = REDUCERS[name]
    tree = probe.tree_from_sizes(probe.reveal_meeting_sizes(N, 8, "cpu", mean=mean).numpy())
    rows = _fresh_rows()
    assert torch.equal(finish(probe.sum_by_tree(tree, rows)), mean(rows))


def test_the_rows_tell_orders_apart():
    # a left-to-right sum of the same rows misses the emulated order's bits somewhere
    rows = _fresh_rows()
    mean, finish = REDUCERS["torch's GPU order, 16 threads"]
    left_fold = rows[:, 0]
    for i in range(1, N):
        left_fold = left_fold + rows[:, i]
    assert not torch.equal(finish(left_fold), mean(rows))
