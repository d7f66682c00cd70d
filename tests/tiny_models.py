"""Tiny model directories for the benchmark and probe smoke tests (dummy weights, real
architectures)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
