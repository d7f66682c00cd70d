"""What kernels compile to on an H100/H200 (sm90), from this machine: compiling needs a
process outside the CPU interpreter (``json_outside_interpreter``), such as
``kernels/hopper_ptx.py``'s counts of chosen PTX instructions in the engine's kernels
(``hopper_ptx_counts``)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).parent / "kernels" / "hopper_ptx.py"


def json_outside_interpreter(*args: str) -> Any:
    """The JSON on the last line that ``python ARGS...`` prints, run with
    ``TRITON_INTERPRET`` unset; raises ``RuntimeError`` with its stderr if it fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"python {args[0]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@functools.cache
def hopper_ptx_counts() -> dict[str, dict[str, int]]:
    """{case: {instruction: count}}; compiled once per test process."""
    return json_outside_interpreter(str(SCRIPT))
