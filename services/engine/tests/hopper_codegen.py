"""What the engine's kernels compile to on an H100/H200 (sm90), from this machine: runs
``kernels/hopper_ptx.py`` in a process outside the CPU interpreter and returns its
counts of chosen PTX instructions per case (see that script)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "kernels" / "hopper_ptx.py"


@functools.cache
def hopper_ptx_counts() -> dict[str, dict[str, int]]:
    """{case: {instruction: count}}; compiled once per test process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"hopper_ptx.py failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
