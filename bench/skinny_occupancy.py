"""How the skinny GEMM's one-row candidates sit on an H100/H200, compiled here without a GPU.

For each Qwen3 decoder shape (and the 8B lm_head) and each config the decode-GEMM tuner
times at one row (``candidate_configs(1, N, K, pdl=True)``; the down projections gated, as
they run), the kernel is compiled for sm90 (``kernels/offline_compile.py``: the Triton
wheel's ptxas, alignment specialized as in a real launch) and reported:
registers per thread, programs per SM (registers allocated per warp in blocks of 256,
threads, CTA slots, shared memory), programs resident at once on 132 SMs, the grid, and
the waves that makes. A grid a little over one wave runs a short second wave with the
GPU mostly idle; a GEMV reads HBM well only with enough loads in flight.

Static facts only: how fast a config runs is ``bench/skinny_gemm_gpu.py``'s and the
tuner's business on the GPU. ``--picks FILE`` marks the configs an offline bench JSON
recorded as the tuner's picks (``decode_gemm_picks``).

Register counts follow the Triton version (8B qkv 8x512 pdl+2: 85 registers with 3.9.0,
5 programs per SM; 80 with 3.6.0, 6). To see what the GPU machine runs, put its version
first: ``pip install --no-deps --target /tmp/t triton==3.6.0`` and run with
``PYTHONPATH=/tmp/t``.

Usage: python bench/skinny_occupancy.py [--out bench/results] [--picks FILE]
Runs on the CPU in about ten seconds (TRITON_INTERPRET must be unset).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from common import RESULTS_DIR, environment, write_results

ROOT = Path(__file__).resolve().parents[1]
SMS = 132  # H100 SXM and H200
# (K, N) beyond the decoder layers: the 8B lm_head
EXTRA_SHAPES = {"8B lm_head": (4096, 151936)}


def measure(offline, label, n: int, cfg, gated: bool) -> dict:
    compiled = offline.compile_skinny(cfg, gated=gated)
    registers = offline.registers_per_thread(compiled)
    per_sm = offline.ctas_per_sm(registers, cfg.num_warps * 32, compiled.metadata.shared)
    programs = cfg.grid(n)[0]
    resident = per_sm * SMS
    return {
        "config": label(cfg),
        "registers": registers,
        "shared_bytes": compiled.metadata.shared,
        "programs_per_sm": per_sm,
        "resident": resident,
        "programs": programs,
        "waves": round(programs / resident, 2) if resident else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--picks", type=Path, help="an offline bench JSON with decode_gemm_picks")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("unset TRITON_INTERPRET: this compiles for the GPU")
    sys.path.insert(0, str(ROOT / "services" / "engine" / "src"))
    from jacana_engine.kernels import offline_compile as offline
    from jacana_engine.kernels import skinny_gemm as kernel
    from jacana_engine.tuning.decode_gemm import config_label

    picks: dict[str, str] = {}
    if args.picks:
        for model in json.loads(args.picks.read_text())["models"].values():
            for shape, choice in (model["info"].get("decode_gemm_picks") or {}).items():
                one_row = choice.get("skinny", {}).get("1")
                if one_row:
                    picks[shape] = one_row
    rows = []
    for name, (k, n) in {**kernel.QWEN3_SHAPES, **EXTRA_SHAPES}.items():
        gated = name.endswith("down")
        pick = picks.get(f"{n}x{k}" + (" gated" if gated else ""))
        for cfg in kernel.candidate_configs(1, n, k, pdl=True):
            row = {"shape": name, "n": n, "k": k, "gated": gated}
            row.update(measure(offline, config_label, n, cfg, gated))
            row["picked"] = row["config"] == pick
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = [
        "# Skinny GEMM at one row: registers, residency and waves on an H100/H200 (sm90)",
        "",
        "Compiled on the CPU for sm90 (`bench/skinny_occupancy.py`); "
        f"{SMS} SMs. Environment: `{json.dumps(environment())}`."
        + (f" Picks from `{args.picks.name}`." if args.picks else ""),
        "",
        "| shape | config | registers | per SM | resident | programs | waves | picked |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['config']} | {r['registers']} | {r['programs_per_sm']} | "
            f"{r['resident']} | {r['programs']} | {r['waves']} | {'yes' if r['picked'] else ''} |"
        )
    doc = {"environment": environment(), "sms": SMS, "rows": rows,
           "picks_from": str(args.picks) if args.picks else None}  # fmt: skip
    json_path, md_path = write_results(args.out, "skinny_occupancy", doc, "\n".join(lines))
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
