"""``bench/program_timeline_gpu.py``'s reading of per-program stamps: a made-up replay of
three launches whose dependencies, ramps and tails are known, read back through the
tool's functions."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import program_timeline_gpu as timeline  # noqa: E402

from jacana_engine.kernels._trace import FIELDS, TraceLaunch  # noqa: E402


def _launch(start, waited, worked, end, sm) -> np.ndarray:
    return np.array([start, waited, worked, end, sm], dtype=np.int64).T


def _replay() -> tuple[np.ndarray, list[TraceLaunch]]:
    """A norm (1 program), a GEMV of 4 programs (two started early, during the norm) and
    another norm after it; then rows of a launch the replay never reached (zeros)."""
    norm = _launch([1000], [1000], [2000], [3000], [0])
    gemv = _launch(
        [2500, 2600, 3500, 3600],  # two resident before the norm's end (3000)
        [3400, 3400, 3500, 3600],  # released 400 ns after it
        [5400, 5400, 6000, 6100],
        [5500, 5500, 6100, 7000],  # the last one 1200 ns behind the median (5800)
        [1, 2, 1, 3],
    )
    norm2 = _launch([6900], [7300], [7800], [8000], [5])
    buffer = np.concatenate([norm, gemv, norm2, np.zeros((2, FIELDS), dtype=np.int64)])
    launches = [
        TraceLaunch("rms_norm", 0, 1),
        TraceLaunch("gemv 4096x4096", 1, 4),
        TraceLaunch("rms_norm", 5, 1),
        TraceLaunch("warm-up", 6, 2),
    ]
    return buffer, launches


def test_a_replay_reads_as_its_dependencies_ramps_and_tails():
    found = timeline.launch_rows(*_replay())
    assert [f["name"] for f in found] == ["rms_norm", "gemv 4096x4096", "rms_norm"]
    gemv, norm2 = timeline.per_launch(found, rate=4096 * 4096 * 2 / 4e-6)  # ideal: 4 µs
    assert gemv["after"] == "rms_norm" and gemv["programs"] == 4
    assert gemv["release_us"] == pytest.approx(0.4)
    assert gemv["critical_us"] == pytest.approx(4.0)  # 3000 -> 7000
    assert gemv["early"] == pytest.approx(0.5)
    assert gemv["first_work_us"] == pytest.approx(2.0)  # the first passed the wait: 3400
    assert gemv["wait_spread_us"] == pytest.approx(0.2)
    assert gemv["tail_us"] == pytest.approx(1.2)  # the median end is 5800
    assert gemv["sms"] == 3
    assert gemv["ideal_us"] == pytest.approx(4.0) and gemv["rate_tb_s"] == pytest.approx(8.39, 0.01)
    assert norm2["release_us"] == pytest.approx(0.3) and norm2["critical_us"] == pytest.approx(1.0)
    assert norm2["early"] == 1.0 and "ideal_us" not in norm2
    assert timeline.timer_resolution_ns(found) == 100


def test_kinds_take_medians_over_the_layers_in_first_met_order():
    rows = [
        {"name": "gemv a", "after": "rms_norm", "critical_us": c, "early": 1.0}
        for c in (1.0, 5.0, 2.0)
    ] + [{"name": "rms_norm", "after": "gemv a", "critical_us": 3.0, "early": 0.0}]
    kinds = timeline.by_kind(rows)
    assert [(k["name"], k["count"], k["critical_us"]) for k in kinds] == [
        ("gemv a", 3, 2.0),
        ("rms_norm", 1, 3.0),
    ]
    run = {
        "context": 1,
        "graph_ms": 1.0,
        "traced_graph_ms": 1.0,
        "launches": 2,
        "traced_span_ms": 1.0,
        "critical_sum_ms": 1.0,
        "timer_resolution_ns": 32,
        "kinds": kinds,
    }
    doc = {"model": "m", "environment": "e", "rate_tb_s": 4.45, "runs": [run]}
    assert "| gemv a | rms_norm | 3 |" in timeline.render(doc)
