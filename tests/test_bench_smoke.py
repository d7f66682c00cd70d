"""The GPU benchmarks run on the CPU at tiny sizes, so a GPU call is not spent on a script
that no longer runs: the offline and the online benchmark on a two-layer Qwen3, each
writing its result where a rerun overwrites it (``<out>/<benchmark>/<hardware>``)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import hardware, results_paths
from tiny_models import tiny_qwen3

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, **env: str) -> None:
    """``bench/<script> args`` in a process of its own (bench/ on its path, ``env`` added);
    fails the test when it fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench"), **env}
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip


def test_offline_benchmark_smoke(tmp_path):
    """offline_gpu.py's batch-1 workload on the CPU: the results and both tables are
    written, every table row as wide as its header."""
    model = tiny_qwen3(tmp_path)
    run_bench(
        "offline_gpu.py", "--model", str(model),
        "--device", "cpu", "--no-hf", "--workloads", "b1", "--reps", "1", "--kv-gib", "0.25",
        "--out", str(tmp_path)
    )  # fmt: skip
    json_path, md_path = results_paths(tmp_path, "offline_gpu", hardware("cpu"))
    doc = json.loads(json_path.read_text())
    (entry,) = doc["models"].values()
    assert entry["info"]["warm_up_s"] == 0.0  # the warm-up runs on CUDA by default
    b1 = entry["results"]["b1"]["jacana"]
    assert b1["tpot_ms"]["median"] > 0 and b1["output_tok_s"]["median"] > 0
    # the drift: the last quarter's median interval less the first quarter's, in order
    (series,) = entry["results"]["b1"]["jacana_itl_series_ms"]
    quarter = len(series["ms"]) // 4
    drift = statistics.median(series["ms"][-quarter:]) - statistics.median(series["ms"][:quarter])
    assert abs(b1["itl_drift_ms"]["median"] - drift) < 1e-3, (b1["itl_drift_ms"], drift)
    table = md_path.read_text()
    assert "| warm-up s |" in table
    rows = [line for line in table.splitlines() if line.startswith("|")]
    widths = [line.count("|") for line in rows]
    # the results and steps tables (6 columns), the start-up table (9: header, rule, model)
    assert set(widths) == {7, 10} and widths.count(10) == 3, widths


def test_online_benchmark_smoke(tmp_path):
    """online_gpu.py through a real gateway and engine on the CPU: every streamed token
    arrives, each rep is recorded with its compile count, and the result is set against
    the offline c64 of the same model and hardware found under the same results root."""
    model = tiny_qwen3(tmp_path)
    offline, _ = results_paths(tmp_path, "offline_gpu", hardware("cpu"))
    offline.parent.mkdir()
    c64 = {"jacana": {"output_tok_s": {"median": 1000.0}}}
    offline.write_text(json.dumps({"models": {str(model): {"results": {"c64": c64}}}}))
    run_bench(
        "online_gpu.py", "--model", str(model),
        "--device", "cpu", "--concurrency", "2", "--requests", "4", "--prompt", "16",
        "--new-tokens", "8", "--reps", "2", "--kv-gib", "0.25", "--max-batched-tokens", "256",
        "--out", str(tmp_path)
    )  # fmt: skip
    json_path, md_path = results_paths(tmp_path, "online_gpu", hardware("cpu"))
    doc = json.loads(json_path.read_text())
    streaming = doc["gateway_streaming"]
    assert [r["output_tokens"] for r in streaming["reps"]] == [32, 32]
    assert all(r["triton_kernels_compiled"] == 0 for r in streaming["reps"])
    assert streaming["output_tok_s"]["n"] == 2 and streaming["ttft_ms"]["median"] > 0
    assert "| 1 | " in md_path.read_text()
    assert doc["online_share"] == streaming["output_tok_s"]["median"] / 1000.0
    assert doc["offline_result"] == str(offline)
