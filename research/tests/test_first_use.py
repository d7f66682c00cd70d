"""``research/first_use_gpu.py``'s helpers: the row counts it draws and its summary of first
calls against repeats (the probe itself needs a GPU)."""

from __future__ import annotations

import random

import pytest
from first_use_gpu import gemm_rows, summary


def test_row_counts_are_new_and_never_a_multiple_of_16():
    taken = {17, 18}
    rows = gemm_rows(random.Random(3), 40, 200, taken)
    assert len(rows) == len(set(rows)) == 40
    assert all(17 <= m <= 200 and m % 16 and m not in (17, 18) for m in rows)
    assert taken >= set(rows)  # the next draw avoids them too
    again = gemm_rows(random.Random(3), 10, 200, taken)
    assert not set(again) & set(rows)


def test_summary_sets_first_calls_against_repeats():
    s = summary([(150.0, 20.0), (130.0, 30.0), (2000.0, 25.0)])
    assert s["calls"] == 3 and s["first_median_us"] == 150.0 and s["first_max_us"] == 2000.0
    assert s["again_median_us"] == 25.0
    assert s["extra_total_ms"] == pytest.approx((2280.0 - 75.0) / 1e3)
