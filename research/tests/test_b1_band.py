"""``research/b1_band.py``: a batch-1 run's intervals lined up with nvidia-smi's samples. Here
a run whose steps slow down for a stretch while the samples show the SM clock down and a
power-cap reason, written as offline_gpu.py and nvidia-smi write them, through the
script's command line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import b1_band

SCRIPT = Path(b1_band.__file__)


def _smi_line(t: float, sm: int, reasons: int) -> str:
    stamp = datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    return f"{stamp}, {sm} MHz, 3201 MHz, 190.50 W, 41, 39, {reasons:#018x}"


def _run(t0: float) -> tuple[list[float], list[str]]:
    """300 steps of 4 ms, 4.4 ms from the 100th to the 199th; samples every 50 ms with
    the SM clock at 1500 MHz and reason 0x4 while the slow steps run."""
    steps = [4.0] * 100 + [4.4] * 100 + [4.0] * 100
    ends = [t0 + sum(steps[: i + 1]) / 1e3 for i in range(len(steps))]
    slow = (ends[99], ends[199])
    lines = ["timestamp, clocks.current.sm [MHz], ..."]  # a header, skipped
    t = t0 - 0.2
    while t < ends[-1] + 0.2:
        inside = slow[0] <= t < slow[1]
        lines.append(_smi_line(t, 1500 if inside else 1980, 0x4 if inside else 0x0))
        t += 0.05
    lines.append(lines[-1][:12])  # a cut last line, skipped
    return steps, lines


def test_windows_show_the_clock_of_the_slow_steps():
    t0 = time.time()
    steps, lines = _run(t0)
    samples = b1_band.parse_smi(lines)
    assert len(samples) == len(lines) - 2
    assert samples[0].values["sm_mhz"] == 1980 and samples[0].values["power_w"] == 190.5
    rows = b1_band.windows(b1_band.token_times(t0, steps), samples, 0.1)
    assert sum(r["steps"] for r in rows) == len(steps)
    slow = [r for r in rows if r["step_ms"] > 4.3]
    fast = [r for r in rows if r["step_ms"] < 4.05]
    assert slow and fast
    assert all(r["sm_mhz"] == 1500 and r["reasons"] == "0x4" for r in slow[1:-1])
    assert all(r["sm_mhz"] == 1980 and r["reasons"] == "0x0" for r in fast[1:-1])


def test_the_command_line_writes_a_table_per_rep(tmp_path):
    t0 = time.time()
    steps, lines = _run(t0)
    result = tmp_path / "b1.json"
    series = [{"t0_unix": t0, "ms": steps}, {"t0_unix": t0, "ms": steps[:50]}]
    result.write_text(
        json.dumps({"models": {"qwen3-8b": {"results": {"b1": {"jacana_itl_series_ms": series}}}}})
    )
    smi = tmp_path / "smi.csv"
    smi.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(result), str(smi)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    table = (tmp_path / "b1_band.md").read_text()
    assert done.stdout == table + "\n"
    assert "Rep 1:" in table and "Rep 2:" in table and "| 1500 |" in table
