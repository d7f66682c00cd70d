"""The GPU benchmarks that have a CPU smoke mode run it, so a GPU call is not spent on a
script that no longer runs: the prefill attention's settings sweep at a tiny shape under
Triton's interpreter; the compile probe, the offline and the online benchmark on a
two-layer Qwen3."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, **env: str) -> None:
    """``bench/<script> args`` in a process of its own (bench/ on its path, ``env`` added);
    fails the test when it fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench"), **env}
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip


def test_prefill_attention_sweep_smoke(tmp_path):
    run_bench(
        "prefill_attention_gpu.py", "--smoke",
        "--device", "cpu", "--out", str(tmp_path), TRITON_INTERPRET="1"
    )  # fmt: skip
    rows = json.loads((tmp_path / "prefill_attention_gpu.json").read_text())["rows"]
    assert [r["default"] for r in rows] == [True, False]
    assert rows[0]["config"]["block_m"] is None and rows[1]["config"]["block_m"] == 128
    assert all(r["max_abs_diff_vs_default"] < 1e-2 and r["ms"] > 0 for r in rows)
    table = (tmp_path / "prefill_attention_gpu.md").read_text()
    assert "| 2x40 after 16 | None/32/4/3 * |" in table


def tiny_qwen3(tmp_path: Path) -> Path:
    """A two-layer Qwen3 config (the 0.6B's with tiny widths) for dummy weights."""
    config = json.loads((ROOT / "bench" / "configs" / "qwen3-0.6b" / "config.json").read_text())
    config.update(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512,
    )  # fmt: skip
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_compile_stability_smoke(tmp_path):
    """The varied-traffic probe serves its passes on a two-layer Qwen3 on the CPU: every
    request runs to its token budget, the per-pass record is written, and with --replay
    the passes' steps line up for the first-use comparison."""
    model = tiny_qwen3(tmp_path)
    run_bench(
        "compile_stability_gpu.py", "--model", str(model),
        "--device", "cpu", "--passes", "2", "--concurrency", "1", "3", "--kv-gib", "0.25",
        "--replay", "--profile-host", "--profile-cuda", "--out", str(tmp_path), "--name", "cs"
    )  # fmt: skip
    doc = json.loads((tmp_path / "cs.json").read_text())
    assert doc["concurrencies"] == [1, 3] and len(doc["passes"]) == 2
    for p in doc["passes"]:
        assert p["requests"] == 8 and p["output_tokens"] >= 8 and p["steps"] > 0
        assert p["longest_step_ms"] > 0 and isinstance(p["compiled"], list)
    assert "| 1 | 8 |" in (tmp_path / "cs.md").read_text()
    assert doc["warm_up"] and doc["warm_up_s"] > 0 and doc["warm_up_compiled"] == []
    # --replay: both passes served the same traffic, step for step
    first, again = (p["step_log"] for p in doc["passes"])
    assert [s[1:3] for s in first] == [s[1:3] for s in again] and doc["first_use_steps"]
    assert all(p["kernels_loaded"] == [] for p in doc["passes"])  # no Triton kernel on the CPU
    assert all(step[4] == 0 for p in doc["passes"] for step in p["step_log"])  # no draft model
    # --profile-host and --profile-cuda: a table each (torch.profiler on the CPU: host only)
    tables = doc["profile_first_use"]
    assert set(tables) == {"python", "torch host"} and all(len(t) == 20 for t in tables.values())
    assert any(name.startswith("aten::") for name, _, _ in tables["torch host"])
    report = (tmp_path / "cs.md").read_text()
    assert "Host functions" in report and "Operators and CUDA API calls" in report
    # and where the warm pass spent most, largest first
    top = doc["profile_top"]["python"]
    assert len(top) == 25 and [ms for _, ms in top] == sorted((ms for _, ms in top), reverse=True)
    assert "the most time in pass 1" in report


def test_compile_stability_smoke_with_a_draft_model(tmp_path):
    """With in-process speculation by a (random) draft model the probe's passes draft in
    their steps, and each pass names its longest step's tokens."""
    model = tiny_qwen3(tmp_path)
    run_bench(
        "compile_stability_gpu.py", "--model", str(model), "--device", "cpu", "--passes", "1",
        "--concurrency", "3", "--kv-gib", "0.25", "--speculative", "draft_model",
        "--draft-model", str(model), "--out", str(tmp_path), "--name", "cs"
    )  # fmt: skip
    doc = json.loads((tmp_path / "cs.json").read_text())
    assert doc["speculative"] == "draft_model" and doc["draft_model"] == str(model)
    assert doc["speculative_stats"]["draft_model"]["draft_tokens"] > 0
    (only,) = doc["passes"]
    assert only["output_tokens"] >= 6 and sum(only["longest_step_tokens"]) > 0
    # the draft model's rows, step by step: its catch-ups and drafts
    assert (
        sum(step[4] for step in only["step_log"])
        >= doc["speculative_stats"]["draft_model"]["draft_tokens"]
    )
    assert "speculative draft_model" in (tmp_path / "cs.md").read_text()


def test_offline_benchmark_smoke(tmp_path):
    """offline_gpu.py's batch-1 workload on the CPU: the results and both tables are
    written, every table row as wide as its header."""
    model = tiny_qwen3(tmp_path)
    run_bench(
        "offline_gpu.py", "--model", str(model),
        "--device", "cpu", "--no-hf", "--workloads", "b1", "--reps", "1", "--kv-gib", "0.25",
        "--out", str(tmp_path), "--name", "off"
    )  # fmt: skip
    doc = json.loads((tmp_path / "off.json").read_text())
    (entry,) = doc["models"].values()
    assert entry["info"]["warm_up_s"] == 0.0  # the warm-up runs on CUDA by default
    b1 = entry["results"]["b1"]["jacana"]
    assert b1["tpot_ms"]["median"] > 0 and b1["output_tok_s"]["median"] > 0
    # the drift: the last quarter's median interval less the first quarter's, in order
    (series,) = entry["results"]["b1"]["jacana_itl_series_ms"]
    quarter = len(series["ms"]) // 4
    drift = statistics.median(series["ms"][-quarter:]) - statistics.median(series["ms"][:quarter])
    assert abs(b1["itl_drift_ms"]["median"] - drift) < 1e-3, (b1["itl_drift_ms"], drift)
    table = (tmp_path / "off.md").read_text()
    assert "| warm-up s |" in table
    rows = [line for line in table.splitlines() if line.startswith("|")]
    widths = [line.count("|") for line in rows]
    # the results and steps tables (6 columns), the start-up table (9: header, rule, model)
    assert set(widths) == {7, 10} and widths.count(10) == 3, widths


def test_online_benchmark_smoke(tmp_path):
    """online_gpu.py through a real gateway and engine on the CPU: every streamed token
    arrives and each rep is recorded with its compile count."""
    model = tiny_qwen3(tmp_path)
    run_bench(
        "online_gpu.py", "--model", str(model),
        "--device", "cpu", "--concurrency", "2", "--requests", "4", "--prompt", "16",
        "--new-tokens", "8", "--reps", "2", "--kv-gib", "0.25", "--max-batched-tokens", "256",
        "--out", str(tmp_path), "--name", "on"
    )  # fmt: skip
    streaming = json.loads((tmp_path / "on.json").read_text())["gateway_streaming"]
    assert [r["output_tokens"] for r in streaming["reps"]] == [32, 32]
    assert all(r["triton_kernels_compiled"] == 0 for r in streaming["reps"])
    assert streaming["output_tok_s"]["n"] == 2 and streaming["ttft_ms"]["median"] > 0
    assert "| 1 | " in (tmp_path / "on.md").read_text()
