"""Shared helpers of the GPU benchmarks: statistics, random prompts, results files.

Medians come with (min, max) over repetitions. Results are one JSON document per
benchmark plus a Markdown table rendered from it.
"""

from __future__ import annotations

import json
import platform
import statistics
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
CONFIGS_DIR = Path(__file__).resolve().parent / "configs"


def spread(values: list[float]) -> dict[str, Any]:
    """{"median", "min", "max", "n", "values"} of repetitions."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": values,
    }


def fmt_spread(s: dict[str, Any] | None, digits: int = 2) -> str:
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` token ids drawn uniformly (never all zeros), each distinct,
    so no prompt shares a cached prefix with another."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(length)] for _ in range(n)]


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


def write_results(out_dir: Path, name: str, doc: dict[str, Any], table: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text(table + "\n")
