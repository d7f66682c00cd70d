"""``bench/lm_head_picks_gpu.py``'s bookkeeping on the CPU: every choice timed in turn,
a failing one recorded and passed over, the pick in force applied again at the end, and
the table it renders."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2].parent / "bench"))
import lm_head_picks_gpu as tool


def test_each_choice_is_timed_and_the_pick_restored():
    applied = []
    step_times = {"pick": 4.12e-3, "a": 4.27e-3, "b": 4.10e-3}

    def step() -> float:
        if applied[-1] == "broken":
            raise RuntimeError("fails to compile")
        return step_times[applied[-1]]

    rows = tool.time_choices(["pick", "a", "broken", "b"], applied.append, step, lambda: 2.8e-4)
    assert applied == ["pick", "a", "broken", "b", "pick"]
    assert [r["choice"] for r in rows] == ["pick", "a", "broken", "b"]
    assert [r["step_s"] for r in rows] == [4.12e-3, 4.27e-3, None, 4.10e-3]
    assert rows[2]["alone_s"] is None and rows[3]["alone_s"] == 2.8e-4


def test_the_table_names_every_choice_and_its_failures():
    doc = {
        "model": "qwen3-8b",
        "context": 320,
        "environment": {},
        "reps": 3,
        "replays": 20,
        "graph_ms": 3.8,
        "tuned": "4x1024 pdl+2",
        "rows": [
            {"choice": "4x1024 pdl+2", "step_ms": 4.1, "after_graph_us": 300.0, "alone_us": 290.0},
            {"choice": "cuBLAS", "step_ms": None, "after_graph_us": None, "alone_us": None},
        ],
    }
    table = tool.render(doc)
    assert "| 4x1024 pdl+2 | 4.100 | 300.0 | 290.0 |" in table
    assert "| cuBLAS | failed | failed | failed |" in table
