"""The compile-stability probe serves its passes on a two-layer Qwen3 on the CPU, so a GPU
call is not spent on a probe that no longer runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import compile_stability_gpu
from tiny_models import tiny_qwen3

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(compile_stability_gpu.__file__)


def run_probe(*args: str) -> None:
    """``research/compile_stability_gpu.py args`` in a process of its own, bench/ on its
    path; fails the test when it fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench")}
    subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, check=True, capture_output=True, timeout=900
    )


def test_compile_stability_smoke(tmp_path):
    """The varied-traffic probe serves its passes on a two-layer Qwen3 on the CPU: every
    request runs to its token budget, the per-pass record is written, and with --replay
    the passes' steps line up for the first-use comparison."""
    model = tiny_qwen3(tmp_path)
    run_probe(
        "--model", str(model),
        "--device", "cpu", "--passes", "2", "--concurrency", "1", "3", "--kv-gib", "0.25",
        "--replay", "--profile-host", "--profile-cuda", "--out", str(tmp_path), "--name", "cs"
    )  # fmt: skip
    doc = json.loads((tmp_path / "compile_stability_gpu" / "cs.json").read_text())
    assert doc["concurrencies"] == [1, 3] and len(doc["passes"]) == 2
    for p in doc["passes"]:
        assert p["requests"] == 8 and p["output_tokens"] >= 8 and p["steps"] > 0
        assert p["longest_step_ms"] > 0 and isinstance(p["compiled"], list)
    assert "| 1 | 8 |" in (tmp_path / "compile_stability_gpu" / "cs.md").read_text()
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
    report = (tmp_path / "compile_stability_gpu" / "cs.md").read_text()
    assert "Host functions" in report and "Operators and CUDA API calls" in report
    # and where the warm pass spent most, largest first
    top = doc["profile_top"]["python"]
    assert len(top) == 25 and [ms for _, ms in top] == sorted((ms for _, ms in top), reverse=True)
    assert "the most time in pass 1" in report


def test_compile_stability_smoke_with_a_draft_model(tmp_path):
    """With in-process speculation by a (random) draft model the probe's passes draft in
    their steps, and each pass names its longest step's tokens."""
    model = tiny_qwen3(tmp_path)
    run_probe(
        "--model", str(model), "--device", "cpu", "--passes", "1",
        "--concurrency", "3", "--kv-gib", "0.25", "--speculative", "draft_model",
        "--draft-model", str(model), "--out", str(tmp_path), "--name", "cs"
    )  # fmt: skip
    doc = json.loads((tmp_path / "compile_stability_gpu" / "cs.json").read_text())
    assert doc["speculative"] == "draft_model" and doc["draft_model"] == str(model)
    assert doc["speculative_stats"]["draft_model"]["draft_tokens"] > 0
    (only,) = doc["passes"]
    assert only["output_tokens"] >= 6 and sum(only["longest_step_tokens"]) > 0
    # the draft model's rows, step by step: its catch-ups and drafts
    assert (
        sum(step[4] for step in only["step_log"])
        >= doc["speculative_stats"]["draft_model"]["draft_tokens"]
    )
    assert "speculative draft_model" in (tmp_path / "compile_stability_gpu" / "cs.md").read_text()
