"""Line up a batch-1 run's inter-token intervals with nvidia-smi's samples, window by window.

On some H200s a one-request decode runs at its usual pace for the first ~0.5 s, then
5-13% slower for a few hundred steps, then recovers;
a pure HBM copy loop on such a machine keeps one pace throughout. This lines the steps
up with what the card reports at the time (SM and memory clocks, power, temperatures,
the clock event reasons: power cap, thermal, ...) to tell what the band is.

    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,\\
        temperature.memory,clocks_event_reasons.active --format=csv,noheader -lms 50 >SMI &
    python bench/offline_gpu.py --model qwen3-8b --no-hf --workloads b1 --reps 5 --out DIR
    python research/b1_band.py DIR/offline_gpu/<hardware>.json SMI [--window 0.1]

Both must come from one machine: nvidia-smi's timestamps are local time, parsed here in
the local time zone. Writes ``<hardware>_band.md`` beside the result and prints it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

SMI_FIELDS = ("sm_mhz", "mem_mhz", "power_w", "gpu_c", "mem_c")


@dataclass(frozen=True)
class Sample:
    """One nvidia-smi line: its time (Unix seconds), the numeric fields, the event
    reasons' bit mask."""

    t: float
    values: dict[str, float]
    reasons: int


def _number(field: str) -> float:
    """'1980 MHz' -> 1980.0, '82.04 W' -> 82.04; 'N/A' (a field the card lacks) -> nan."""
    head = field.strip().split(" ")[0]
    try:
        return float(head)
    except ValueError:
        return float("nan")


def parse_smi(lines: list[str]) -> list[Sample]:
    """The samples of ``nvidia-smi --query-gpu=timestamp,<SMI_FIELDS>,clocks_event_reasons
    .active --format=csv,noheader``; lines that do not parse (a header, a cut last line)
    are skipped."""
    samples = []
    for line in lines:
        parts = line.split(",")
        if len(parts) != 2 + len(SMI_FIELDS):
            continue
        try:
            t = datetime.strptime(parts[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            reasons = int(parts[-1].strip(), 16)
        except ValueError:
            continue
        values = dict(zip(SMI_FIELDS, map(_number, parts[1:-1]), strict=True))
        samples.append(Sample(t, values, reasons))
    return samples


def token_times(t0: float, intervals_ms: list[float]) -> list[tuple[float, float]]:
    """(arrival time, interval ms) of each token after a request's first, which came at
    ``t0``."""
    out, t = [], t0
    for ms in intervals_ms:
        t += ms / 1e3
        out.append((t, ms))
    return out


def windows(tokens: list[tuple[float, float]], samples: list[Sample], width: float) -> list[dict]:
    """Consecutive ``width``-second windows from the first token on: the tokens that
    arrived in each (their mean interval), and the samples taken in it (mean of each
    field, the reasons OR-ed); a window with no token is left out."""
    if not tokens:
        return []
    start = tokens[0][0] - tokens[0][1] / 1e3  # when the first interval began
    rows: dict[int, dict] = {}
    for t, ms in tokens:
        rows.setdefault(int((t - start) // width), {"ms": [], "samples": []})["ms"].append(ms)
    for s in samples:
        i = int((s.t - start) // width) if s.t >= start else -1
        if i in rows:
            rows[i]["samples"].append(s)
    out = []
    for i in sorted(rows):
        got = rows[i]["samples"]
        row = {"t": round(i * width, 3), "steps": len(rows[i]["ms"])}
        row["step_ms"] = statistics.fmean(rows[i]["ms"])
        for f in SMI_FIELDS:
            row[f] = statistics.fmean(s.values[f] for s in got) if got else None
        reasons = 0
        for s in got:
            reasons |= s.reasons
        row["reasons"] = f"{reasons:#x}" if got else None
        out.append(row)
    return out


def _cell(column: str, v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if column in ("t", "step_ms") else f"{v:.0f}"
    return str(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="offline_gpu.py's JSON (a b1 workload)")
    parser.add_argument("smi", type=Path, help="nvidia-smi's samples (module doc)")
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--window", type=float, default=0.1, help="seconds")
    args = parser.parse_args()
    doc = json.loads(args.result.read_text())
    series = doc["models"][args.model]["results"]["b1"].get("jacana_itl_series_ms", [])
    samples = parse_smi(args.smi.read_text().splitlines())
    cols = ("t", "steps", "step_ms", *SMI_FIELDS, "reasons")
    lines = [
        f"# Batch-1 steps against the card's clocks: {args.model}",
        "",
        f"{len(samples)} nvidia-smi samples; windows of {args.window} s from each request's "
        "first token; step_ms: the mean inter-token interval of the tokens that arrived "
        "in the window; reasons: clocks_event_reasons.active OR-ed over its samples.",
    ]
    for rep, s in enumerate(series):
        rows = windows(token_times(s["t0_unix"], s["ms"]), samples, args.window)
        lines += ["", f"Rep {rep + 1}:", "", "| " + " | ".join(cols) + " |"]
        lines.append("|" + "---|" * len(cols))
        lines += ["| " + " | ".join(_cell(c, r[c]) for c in cols) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    args.result.with_name(args.result.stem + "_band.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
