"""The GPU probes' own kernels compile for an H100/H200 (sm90) here, without a GPU, through
the same path as the engine's (``jacana_engine.kernels.offline_compile``): a GPU call is
not spent on a probe that ptxas would reject. The L2-prefetch variant of
``bench/pdl_probe_gpu.py`` must hold its ``cp.async.bulk.prefetch.L2`` instruction, and
the variants without it none."""

from __future__ import annotations

from pathlib import Path

from hopper_codegen import json_outside_interpreter

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = """
import json, sys
sys.path[:0] = [sys.argv[1]]
import pdl_probe_gpu as probe
from jacana_engine.kernels.offline_compile import compile_for, ptx_count, signature_for

fn = probe._gemv_kernel
counts = {}
for l2_bytes in (0, 2048):
    const = dict(BLOCK_N=8, BLOCK_K=1024, WAIT=True, PREFETCH=True, TRIGGER=False,
                 L2_BYTES=l2_bytes, L2_PIECES=16)
    kernel = compile_for(fn, signature_for(fn, const), const,
                         divisible=("x_ptr", "w_ptr", "out_ptr", "N", "K"), num_warps=4)
    counts[l2_bytes] = ptx_count(kernel, "cp.async.bulk.prefetch.L2.global")
print(json.dumps(counts))
"""


def test_the_pdl_probe_compiles_for_hopper_with_and_without_l2_prefetch():
    counts = json_outside_interpreter("-c", _SCRIPT, str(ROOT / "bench"))
    assert counts["0"] == 0 and counts["2048"] >= 1, counts
