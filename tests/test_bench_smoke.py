"""The GPU benchmarks that have a CPU smoke mode run it, so a GPU call is not spent on a
script that no longer runs: the prefill attention's settings sweep at a tiny shape under
Triton's interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_prefill_attention_sweep_smoke(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench"), "TRITON_INTERPRET": "1"}
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "prefill_attention_gpu.py"), "--smoke",
         "--device", "cpu", "--out", str(tmp_path)],
        env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    rows = json.loads((tmp_path / "prefill_attention_gpu.json").read_text())["rows"]
    assert [r["default"] for r in rows] == [True, False]
    assert rows[0]["config"]["block_m"] is None and rows[1]["config"]["block_m"] == 128
    assert all(r["max_abs_diff_vs_default"] < 1e-2 and r["ms"] > 0 for r in rows)
    table = (tmp_path / "prefill_attention_gpu.md").read_text()
    assert "| 2x40 after 16 | None/32/4/3 * |" in table
